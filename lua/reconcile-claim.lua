-- reconcile-claim: a reconciler takes a `reconciling` job under a fenced lease.
--
-- Guarantees: one reconciler at a time (a live lease, on Redis's clock, refuses
-- the next); the generation goes up, so the worker of the unknown attempt, or an
-- earlier reconciler, if still alive somewhere, can no longer write. While the
-- lease lives the reconcile index holds the job at its expiry, so no new
-- reconcile message is sent for it.
--
-- keys: 4
-- KEYS[1] job record (hash)
-- KEYS[2] tenant's leases (zset)
-- KEYS[3] tenant's reconcile index (zset)
-- KEYS[4] wake set (zset)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] worker id
-- ARGV[3] lease length (ms)
--
-- Returns {0 OK, generation, operation id, submitted (0|1), provider epoch at submit,
--   attempt number, now (ms), reconciling since (ms), submitted at (ms, 0 if never),
--   reconcile claims so far (this one included), server that received the prompt}
--   | {8 NOT_CLAIMABLE, state} | {7 NOT_FOUND}

local job, now = KEYS[1], clock(ARGV[1])
local f = hmget(job, 'state', 'lease_expires', 'id', 'operation_id', 'submitted', 'submit_epoch',
  'attempt_count', 'reconcile_since', 'submitted_at', 'server')
if not f[1] then return {7} end
if f[1] ~= 'reconciling' or tonumber(f[2] or '0') > now then return {8, f[1]} end
local expires = now + tonumber(ARGV[3])
local gen = hincrby(job, 'lease_gen', 1)
hset(job, 'lease_owner', ARGV[2], 'lease_expires', expires, 'sends', 0)
local claims = hincrby(job, 'reconcile_claims', 1)
redis.call('ZADD', KEYS[2], expires, f[3])
redis.call('ZADD', KEYS[3], expires, f[3])
wake(KEYS[4], job, expires)
return {0, gen, f[4] or '', tonumber(f[5] or '0'), f[6] or '', tonumber(f[7] or '0'), now,
  tonumber(f[8] or tostring(now)), tonumber(f[9] or '0'), claims, f[10] or ''}
