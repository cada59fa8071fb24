-- finish: ends a running job as completed or failed and settles its cost, once.
--
-- Guarantees: only the current lease generation finishes the job; a job
-- completes only with every requested output recorded; in the same step the
-- actual cost is settled once and the rest of the reservation is released.
--
-- KEYS[1] job record (hash)          KEYS[5] job's event list
-- KEYS[2] tenant ledger (hash)       KEYS[6] job's outputs (hash)
-- KEYS[3] tenant's leases (zset)     KEYS[7] tenant's per-state counts (hash)
-- KEYS[4] job's attempts (hash)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms)
-- ARGV[3] outcome: completed | failed
-- ARGV[4] actual cost to settle (cost units)
-- ARGV[5] error class ('' when completed)
-- ARGV[6] safe reason (an identifier, never provider text)
--
-- Returns {0 OK} | {9 STALE_LEASE} | {10 OUTPUTS_MISSING, stored, requested}

local job, now, outcome = KEYS[1], ARGV[2], ARGV[3]
if not holds_lease(job, ARGV[1]) then return {9} end
if outcome == 'completed' then
  local stored = redis.call('HLEN', KEYS[6])
  local requested = tonumber(redis.call('HGET', job, 'outputs_requested'))
  if stored < requested then return {10, stored, requested} end
end

settle(job, KEYS[2], now, tonumber(ARGV[4]))
end_attempt(job, KEYS[4], now, outcome, ARGV[5])
redis.call('ZREM', KEYS[3], redis.call('HGET', job, 'id'))
redis.call('HSET', job, 'error_class', ARGV[5], 'error_reason', ARGV[6])
move(job, KEYS[7], KEYS[5], now, 'running', outcome, ARGV[6])
return {0}
