-- heartbeat: renews a running job's lease, only for the current generation.
--
-- The new expiry is on Redis's clock (now + lease length), never the worker's. It is the record's;
-- the leases index keeps its earlier entry (`renew` in _lib.lua).
--
-- keys: 2
-- KEYS[1] job record (hash)
-- KEYS[2] tenant's leases (zset)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] lease length (ms)
--
-- Returns {0 OK, new expiry (ms)} | {9 STALE_LEASE}

preload(KEYS[1], {'state', 'lease_gen', 'lease_expires', 'id'})  -- what the fence and renew read: not the whole record
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local expires = clock(ARGV[2]) + tonumber(ARGV[3])
renew(KEYS[1], KEYS[2], nil, expires)
return {0, expires}
