-- reconcile-later: the provider is still working on it (or could not be asked); ask
-- again after `delay` (fenced). The reconciler's lease ends here.
--
-- keys: 4
-- KEYS[1] job record (hash)
-- KEYS[2] tenant's leases (zset)
-- KEYS[3] tenant's reconcile index (zset)
-- KEYS[4] wake set (zset)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] delay (ms)
-- ARGV[3] now (ms; '' = Redis's clock)
--
-- Returns {0 OK} | {9 STALE_LEASE}

if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local job_id = hget(KEYS[1], 'id')
release(KEYS[1], KEYS[2], job_id)
local due = clock(ARGV[3]) + tonumber(ARGV[2])
redis.call('ZADD', KEYS[3], due, job_id)
wake(KEYS[4], KEYS[1], due)
return {0}
