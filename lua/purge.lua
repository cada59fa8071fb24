-- purge: a finished job whose retention has passed is removed with everything it owns.
--
-- Guarantees: only a terminal job settled at least `retention` ago is removed: its
-- record, attempts, events, progress events, outputs records and workflow, and its entries in the
-- tenant's job, dead-letter and done indexes; the per-state counts (the tenant's and
-- the global ones) count only the jobs still kept. A job no longer terminal (replayed)
-- only leaves the done index. Output blobs are removed by `reckon blobs gc`.
--
-- keys: 14
-- KEYS[1] job record (hash)          KEYS[5] job's workflow (string)
-- KEYS[2] job's attempts (hash)      KEYS[6] tenant's job index (zset)
-- KEYS[3] job's event list           KEYS[7] tenant's dead letters (zset)
-- KEYS[4] job's outputs (hash)       KEYS[8] tenant's done index (zset)
-- KEYS[9] job's progress events      KEYS[10] job's progress marks (hash)
-- KEYS[11] tenant's per-state counts (hash)
-- KEYS[12] global stats (hash), KEYS[13] queue (zset), KEYS[14] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] job id
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] retention (ms)
--
-- Returns {0 OK} | {11 NOT_DUE} | {7 NOT_FOUND} (the done entry is cleaned)

use_globals(12)
local f = hmget(KEYS[1], 'state', 'settled_at', 'priority')
if f[1] ~= 'completed' and f[1] ~= 'failed' and f[1] ~= 'cancelled' then
  redis.call('ZREM', KEYS[8], ARGV[1])
  return {7}
end
if tonumber(f[2] or '0') + tonumber(ARGV[3]) > clock(ARGV[2]) then return {11} end
redis.call('HINCRBY', KEYS[11], f[1], -1)
redis.call('HINCRBY', G.stats, 'jobs:' .. f[3] .. ':' .. f[1], -1)
forget(KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[9], KEYS[10])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[1])
return {0}
