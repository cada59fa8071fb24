-- expire-lease: a running job whose lease ran out goes back to the queue.
--
-- Guarantees: acts only when the lease really expired at `now`; the expired
-- attempt is closed; the old lease generation stays fenced out because the
-- job is no longer `running`. A job with no attempts left fails instead and
-- releases its reservation.
--
-- KEYS[1] job record (hash)          KEYS[5] tenant's outbox (zset)
-- KEYS[2] tenant ledger (hash)       KEYS[6] job's attempts (hash)
-- KEYS[3] tenant's leases (zset)     KEYS[7] job's event list
-- KEYS[4] tenant's queued (zset)     KEYS[8] tenant's per-state counts (hash)
--
-- ARGV[1] now (ms)
-- ARGV[2] job id
--
-- Returns {0 OK, new state} | {11 NOT_DUE} | {7 NOT_FOUND} (also cleans the index)

local job, now, job_id = KEYS[1], ARGV[1], ARGV[2]
local f = redis.call('HMGET', job, 'state', 'lease_expires', 'attempt_count', 'attempts_allowed')
if f[1] ~= 'running' then
  redis.call('ZREM', KEYS[3], job_id)
  return {7}
end
if tonumber(f[2]) > tonumber(now) then return {11} end

end_attempt(job, KEYS[6], now, 'lease_expired', 'lease_expired')
redis.call('ZREM', KEYS[3], job_id)
if tonumber(f[3]) >= tonumber(f[4]) then
  settle(job, KEYS[2], now, 0)
  redis.call('HSET', job, 'error_class', 'attempts_exhausted', 'error_reason', 'lease_expired')
  move(job, KEYS[8], KEYS[7], now, 'running', 'failed', 'attempts_exhausted')
  return {0, 'failed'}
end
redis.call('ZADD', KEYS[4], now, job_id)
redis.call('ZADD', KEYS[5], now, job_id)
move(job, KEYS[8], KEYS[7], now, 'running', 'queued', 'lease_expired')
return {0, 'queued'}
