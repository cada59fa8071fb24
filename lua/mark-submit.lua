-- mark-submit: the worker is about to send the provider request (fenced).
--
-- Guarantees: from here on the attempt may have executed, so recovery asks the
-- provider before paying again; a job whose cancel was requested is never
-- submitted (the cancel and this check are each atomic, so exactly one wins).
-- The lease is renewed in the same step, so the worker knows it holds the job
-- for a full lease length from the moment it sent this call (on the record: the leases index keeps
-- its earlier entry, `renew` in _lib.lua). A job with too little
-- time left before its deadline is not submitted (the caller fails it).
--
-- keys: 4
-- KEYS[1] job record (hash)
-- KEYS[2] job's attempts (hash)
-- KEYS[3] tenant's leases (zset)
-- KEYS[4] fleet (hash): a paused class or server sends nothing new
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] provider epoch seen just before submission ('' when the provider has none)
-- ARGV[4] lease length (ms)
-- ARGV[5] least time an attempt needs (ms)
--
-- Returns {0 OK} | {9 STALE_LEASE} | {12 CANCELLED} | {14 EXPIRED} | {16 PAUSED}

-- the fields the fence, this step and renew read, in one HMGET: not the whole record
preload(KEYS[1], {'state', 'lease_gen', 'cancel_requested', 'deadline', 'priority', 'server', 'lease_expires', 'id',
  'attempt_count'})
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local f = hmget(KEYS[1], 'cancel_requested', 'deadline', 'priority', 'server')
if f[1] == '1' then return {12} end
if paused_for(KEYS[4], f[3] or 'interactive', f[4]) then return {16} end
local now = clock(ARGV[2])
if now + tonumber(ARGV[5]) >= tonumber(f[2]) then return {14} end
local expires = now + tonumber(ARGV[4])
hset(KEYS[1], 'submitted', 1, 'submit_epoch', ARGV[3], 'submitted_at', now)
renew(KEYS[1], KEYS[3], nil, expires)
local n = hget(KEYS[1], 'attempt_count')
local attempt = cjson.decode(redis.call('HGET', KEYS[2], n))
attempt.submitted_at = now
redis.call('HSET', KEYS[2], n, cjson.encode(attempt))
return {0}
