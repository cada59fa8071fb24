-- reconcile-later: the provider is still working on it; ask again at `due` (fenced).
--
-- KEYS[1] job record (hash)
-- KEYS[2] tenant's leases (zset)
-- KEYS[3] tenant's reconcile index (zset)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] due time (ms)
--
-- Returns {0 OK} | {9 STALE_LEASE}

if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local job_id = redis.call('HGET', KEYS[1], 'id')
redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_expires', 0)
redis.call('ZREM', KEYS[2], job_id)
redis.call('ZADD', KEYS[3], ARGV[2], job_id)
return {0}
