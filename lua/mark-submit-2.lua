-- mark-submit: the worker is about to send the provider request (fenced).
--
-- Guarantees: from here on the attempt may have executed, so recovery asks the
-- provider before paying again; a job whose cancel was requested is never
-- submitted (the cancel and this check are each atomic, so exactly one wins).
--
-- KEYS[1] job record (hash)
-- KEYS[2] job's attempts (hash)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] provider epoch seen just before submission ('' when the provider has none)
--
-- Returns {0 OK} | {9 STALE_LEASE} | {12 CANCELLED}

if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {12} end
redis.call('HSET', KEYS[1], 'submitted', 1, 'submit_epoch', ARGV[3])
local n = redis.call('HGET', KEYS[1], 'attempt_count')
local attempt = cjson.decode(redis.call('HGET', KEYS[2], n))
attempt.submitted_at = clock(ARGV[2])
redis.call('HSET', KEYS[2], n, cjson.encode(attempt))
return {0}
