-- retry: a running or reconciling job waits in retry_wait for `delay` (fenced).
--
-- Guarantees: only the current lease generation schedules the retry, and the
-- lease ends with it; the job sits in the tenant's retry index scored by its due
-- time on Redis's clock, where the sweeper finds it. The job's dispatch slot
-- is given back: the next attempt may run on another server. Whether a retry is allowed
-- (attempts, reservation, deadline, budget) the caller decided from the record.
--
-- keys: 13
-- KEYS[1] job record (hash)          KEYS[5] tenant's per-state counts (hash)
-- KEYS[2] tenant's leases (zset)     KEYS[6] tenant's retry index (zset)
-- KEYS[3] job's attempts (hash)      KEYS[7] tenant's reconcile index (zset)
-- KEYS[4] job's event list          KEYS[8] wake set (zset)
--                                   KEYS[9] fleet (hash)
--
-- KEYS[10] global stats (hash), KEYS[11] queue (zset), KEYS[12] due (zset):
--   see use_globals in _lib.lua
-- KEYS[13] fleet's parked jobs (zset): the caller publishes them if this freed their slot
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] delay (ms)
-- ARGV[4] error class
-- ARGV[5] 1 when nothing was sent (connection refused, paused, mark unconfirmed, credentials
--         refused): the attempt ends `not_sent` and counts neither against the job's attempts
--         nor in its view's attempt_count; else 0 (it ends `failed`)
--
-- Returns {0 OK, due (ms), jobs parked in the shard (0 when it gave no slot back)} | {9 STALE_LEASE}

use_globals(10)
local job, now = KEYS[1], clock(ARGV[2])
if not holds_lease(job, ARGV[1]) then return {9} end
local job_id = hget(job, 'id')
local from = hget(job, 'state')
local due = now + tonumber(ARGV[3])
if ARGV[5] == '1' then  -- nothing reached a server that could run it: the attempt was never a submission
  end_attempt(job, KEYS[3], now, 'not_sent', ARGV[4], true)
  -- a submit mark made before the send failed is taken back: nothing can have run
  hset(job, 'submitted', 0, 'submit_epoch', '', 'submitted_at', 0)
  hincrby(job, 'attempts_allowed', 1)
  hincrby(job, 'attempts_not_sent', 1)
else
  end_attempt(job, KEYS[3], now, 'failed', ARGV[4])
end
local freed = free_slot(job, KEYS[9])
release(job, KEYS[2], job_id)
redis.call('ZREM', KEYS[7], job_id)
redis.call('ZADD', KEYS[6], due, job_id)
wake(KEYS[8], job, due)
hset(job, 'error_class', ARGV[4], 'error_reason', ARGV[4], 'retry_at', due)
redis.call('HINCRBY', G.stats, 'retries:' .. ARGV[4], 1)
move(job, KEYS[5], KEYS[4], now, from, 'retry_wait', ARGV[4])
return {0, due, freed and redis.call('ZCARD', KEYS[13]) or 0}
