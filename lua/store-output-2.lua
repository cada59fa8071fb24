-- store-output: records durably stored outputs on the job, fenced, in one step.
--
-- Guarantees: only the current lease generation writes; an index already
-- recorded (say by an earlier attempt) keeps its first record. A worker records each
-- output right after its copy into the blob store (one pair a call): a copied output is
-- never left unrecorded by a worker that dies before its next copy.
--
-- KEYS[1] job record (hash)
-- KEYS[2] job's outputs (hash: index -> JSON)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3], ARGV[4], ... output index (0-based), output record (JSON: sha256, bytes, content_type),
--   one pair per output
--
-- Returns {0 OK, outputs recorded now (those already there are not)} | {9 STALE_LEASE}

if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local added = 0
for i = 3, #ARGV, 2 do added = added + redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) end
hset(KEYS[1], 'updated_at', clock(ARGV[2]))
return {0, added}
