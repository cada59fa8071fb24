-- store-output: records durably stored outputs on the job, fenced, in one step.
--
-- Guarantees: only the current lease generation writes; an index already
-- recorded (say by an earlier attempt) keeps its first record. The caller copies
-- all of an attempt's outputs into the blob store first, then records them here at
-- once; an attempt that fails partway records the ones it copied before it gives up.
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
local stored, added = hgetall(KEYS[2]), 0
for i = 3, #ARGV, 2 do
  if not stored[ARGV[i]] then
    hset(KEYS[2], ARGV[i], ARGV[i + 1])
    added = added + 1
  end
end
hset(KEYS[1], 'updated_at', clock(ARGV[2]))
return {0, added}
