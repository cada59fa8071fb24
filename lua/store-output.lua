-- store-output: records one durably stored output on the job, fenced.
--
-- Guarantees: only the current lease generation writes; an index already
-- recorded (say by an earlier attempt) keeps its first record.
--
-- keys: 2
-- KEYS[1] job record (hash)
-- KEYS[2] job's outputs (hash: index -> JSON)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] output index (0-based)
-- ARGV[4] output record (JSON: sha256, bytes, content_type)
--
-- Returns {0 OK, 1 if recorded now or 0 if it was already there} | {9 STALE_LEASE}

-- The two fields the fence reads, not the whole record (HGETALL of about 35 fields into a Lua table, for
-- 2 of them: a finished job's packed fields stay packed, and its `state` fails the fence as before).
preload(KEYS[1], {'state', 'lease_gen'})
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local added = redis.call('HSETNX', KEYS[2], ARGV[3], ARGV[4])
hset(KEYS[1], 'updated_at', clock(ARGV[2]))
return {0, added}
