-- promote: a retry_wait job whose time has come is queued again (sweeper).
--
-- Guarantees: acts only when due; a job whose deadline has passed fails with
-- `deadline_exceeded` instead, settled and dead-lettered; a promoted job enters
-- the outbox, so it is published even if the sweeper dies right after.
--
-- keys: 14
-- KEYS[1] job record (hash)          KEYS[7]  tenant's per-state counts (hash)
-- KEYS[2] tenant ledger (hash)       KEYS[8]  tenant's dead letters (zset)
-- KEYS[3] tenant's retry index       KEYS[9]  tenant's done index (zset)
-- KEYS[4] tenant's queued (zset)     KEYS[10] job's workflow (string)
-- KEYS[5] tenant's outbox (zset)     KEYS[11] wake set (zset)
-- KEYS[6] job's event list
--
-- KEYS[12] global stats (hash), KEYS[13] queue (zset), KEYS[14] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] job id
-- ARGV[3] retention (ms; '' = 0: see finalize in _lib.lua)
--
-- Returns {0 OK, new state} | {11 NOT_DUE} | {7 NOT_FOUND} (also cleans the index)

use_globals(12)
local job, now, job_id = KEYS[1], clock(ARGV[1]), ARGV[2]
local f = hmget(job, 'state', 'retry_at', 'deadline')
if f[1] ~= 'retry_wait' then
  redis.call('ZREM', KEYS[3], job_id)
  return {7}
end
if tonumber(f[2]) > now then return {11} end
redis.call('ZREM', KEYS[3], job_id)
if tonumber(f[3]) <= now then
  finalize(job, {ledger = KEYS[2], done = KEYS[9], workflow = KEYS[10], wake = KEYS[11], retention = ARGV[3]}, now, 'failed')
  hset(job, 'error_class', 'deadline_exceeded', 'error_reason', 'deadline_exceeded')
  redis.call('ZADD', KEYS[8], now, job_id)
  move(job, KEYS[7], KEYS[6], now, 'retry_wait', 'failed', 'deadline_exceeded')
  return {0, 'failed'}
end
redis.call('ZADD', KEYS[4], now, job_id)
redis.call('ZADD', KEYS[5], now, job_id)
wake(KEYS[11], job, now)
move(job, KEYS[7], KEYS[6], now, 'retry_wait', 'queued', 'retry_due')
return {0, 'queued'}
