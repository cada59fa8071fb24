-- await: the prompt is at the provider; the worker hands the job to the server's
-- watcher and frees its thread (fenced).
--
-- Guarantees: only the current holder, after marking the submission, hands over;
-- the generation goes up, so the handing worker can no longer write; the watcher
-- list of the fleet holds the job with the new generation, its server, operation
-- id, attempt and deadline (the watcher renews no lease past the deadline), `max` (the job's
-- `max_seconds`, when it has one: the watcher interrupts the prompt past them; `sub` then, the submission's
-- time on Redis's clock, from which a watcher that did not see the prompt start counts them), and `cancel` when the
-- client asked to cancel before the hand-over (cancel marks it on a watched job's entry itself), and `ckpt`, the
-- job's checkpoint digest when it has one (the watcher's run clock keeps run times per checkpoint:
-- pipeline/work/runclock.py). The job stays `running` with its slot; the watcher renews its
-- lease (heartbeat with the new generation) while the prompt is pending or running,
-- and a collect message claims it when the prompt ends. If every watcher is gone,
-- the lease expires and the sweeper reconciles the job, as for a dead worker. The watcher's lease
-- is the record's (`renew` in _lib.lua: the leases index keeps its earlier entry).
--
-- keys: 4
-- KEYS[1] job record (hash)          KEYS[3] fleet (hash)
-- KEYS[2] tenant's leases (zset)     KEYS[4] wake set (zset)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] lease length (ms) the watcher has to renew it in
-- ARGV[4] JSON summary of output nodes the server refused while taking the prompt ('' none)
--
-- Returns {0 OK, new generation} | {9 STALE_LEASE} | {8 NOT_CLAIMABLE, 'not_submitted'}

local job = KEYS[1]
-- the fields the fence, the watch entry, renew and wake read, in one HMGET: not the whole record
preload(job, {'state', 'lease_gen', 'id', 'submitted', 'server', 'operation_id', 'attempt_count', 'deadline',
  'cancel_requested', 'max_seconds', 'submitted_at', 'lease_expires', 'tenant', 'ckpt'})
if not holds_lease(job, ARGV[1]) then return {9} end
local f = hmget(job, 'id', 'submitted', 'server', 'operation_id', 'attempt_count', 'deadline', 'cancel_requested',
  'max_seconds', 'submitted_at', 'ckpt')
if f[2] ~= '1' then return {8, 'not_submitted'} end
local now = clock(ARGV[2])
local expires = now + tonumber(ARGV[3])
local gen = hincrby(job, 'lease_gen', 1)
hset(job, 'lease_owner', 'watcher')
renew(job, KEYS[2], KEYS[4], expires)
if ARGV[4] ~= '' then hset(job, 'refusal', ARGV[4]) end  -- kept across hand-backs
redis.call('HSET', KEYS[3], 'w:' .. f[1], cjson.encode({server = f[3], gen = gen, op = f[4], attempt = tonumber(f[5]),
  deadline = tonumber(f[6]), cancel = f[7] == '1' and 1 or nil, max = tonumber(f[8]),
  sub = tonumber(f[8]) and tonumber(f[9]) or nil, ckpt = f[10] or nil}))
return {0, gen}
