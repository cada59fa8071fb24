-- heartbeat: renews a running job's lease, only for the current generation.
--
-- The new expiry is on Redis's clock (now + lease length), never the worker's.
--
-- KEYS[1] job record (hash)
-- KEYS[2] tenant's leases (zset)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] lease length (ms)
--
-- Returns {0 OK, new expiry (ms)} | {9 STALE_LEASE}

if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local expires = clock(ARGV[2]) + tonumber(ARGV[3])
hset(KEYS[1], 'lease_expires', expires)
redis.call('ZADD', KEYS[2], expires, hget(KEYS[1], 'id'))
return {0, expires}
