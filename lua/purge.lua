-- purge: a finished job whose retention has passed is removed with everything it owns.
--
-- Guarantees: only a terminal job settled at least `retention` ago is removed: its
-- record, attempts, events, progress events, outputs records and workflow, and its entries in the
-- tenant's job, dead-letter and done indexes, and the ids of the adjustments booked against it
-- (the record's `adjustments`, live or packed) from the tenant's bookings and booking log: an id
-- is booked once for as long as its job is kept, since no statement can be reconciled against a
-- job once it is gone (docs/costs.md "Adjustments"). The per-state counts (the tenant's and
-- the global ones) count only the jobs still kept. A job no longer terminal (replayed)
-- only leaves the done index. Output blobs are removed by `reckon blobs gc`.
--
-- keys: 16
-- KEYS[1] job record (hash)          KEYS[5] job's workflow (string)
-- KEYS[2] job's attempts (hash)      KEYS[6] tenant's job index (zset)
-- KEYS[3] job's event list           KEYS[7] tenant's dead letters (zset)
-- KEYS[4] job's outputs (hash)       KEYS[8] tenant's done index (zset)
-- KEYS[9] job's progress events      KEYS[10] job's progress marks (hash)
-- KEYS[11] tenant's per-state counts (hash)
-- KEYS[12] tenant's bookings (hash)  KEYS[13] tenant's booking log (zset)
-- KEYS[14] global stats (hash), KEYS[15] queue (zset), KEYS[16] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] job id
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] retention (ms)
--
-- Returns {0 OK} | {11 NOT_DUE} | {7 NOT_FOUND} (the done entry is cleaned)

use_globals(14)
local f = hmget(KEYS[1], 'state', 'settled_at', 'priority', 'adjustments')
if f[1] ~= 'completed' and f[1] ~= 'failed' and f[1] ~= 'cancelled' then
  redis.call('ZREM', KEYS[8], ARGV[1])
  return {7}
end
if tonumber(f[2] or '0') + tonumber(ARGV[3]) > clock(ARGV[2]) then return {11} end
if f[4] then
  local ids = {}
  for _, entry in ipairs(cjson.decode(f[4])) do ids[#ids + 1] = entry.id end
  for i = 1, #ids, 500 do  -- in slices: unpack's stack is bounded
    local slice = {unpack(ids, i, math.min(i + 499, #ids))}
    redis.call('HDEL', KEYS[12], unpack(slice))
    redis.call('ZREM', KEYS[13], unpack(slice))
  end
end
redis.call('HINCRBY', KEYS[11], f[1], -1)
redis.call('HINCRBY', G.stats, 'jobs:' .. f[3] .. ':' .. f[1], -1)
forget(KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[9], KEYS[10])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[1])
return {0}
