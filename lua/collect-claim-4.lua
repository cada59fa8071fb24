-- collect-claim: a worker takes a job whose prompt ended at the provider, to store
-- its outputs and finish it (fenced).
--
-- Guarantees: only a job the watcher holds (handed over by `await`) is taken, so a
-- duplicated collect message, or one for a job already collected, reconciled or
-- finished, takes nothing; the generation goes up, so the watcher's renewals stop
-- counting; the job leaves the watch list. The collector's lease is the record's (`renew` in
-- _lib.lua: the leases index keeps its earlier entry).
--
-- KEYS[1] job record (hash)          KEYS[3] fleet (hash)
-- KEYS[2] tenant's leases (zset)     KEYS[4] wake set (zset)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] worker id
-- ARGV[3] lease length (ms)
--
-- Returns {0 OK, generation, attempt number, operation id, server, now (ms), cancel requested
--   (0|1), deadline (ms), provider epoch at submission}
--   | {8 NOT_CLAIMABLE, state} | {7 NOT_FOUND}

local job = KEYS[1]
local f = hmget(job, 'state', 'lease_owner', 'id', 'attempt_count', 'operation_id', 'server',
  'cancel_requested', 'deadline', 'submit_epoch')
if not f[1] then return {7} end
if f[1] ~= 'running' or f[2] ~= 'watcher' then return {8, f[1]} end  -- a duplicate reads no clock
local now = clock(ARGV[1])
local expires = now + tonumber(ARGV[3])
local gen = hincrby(job, 'lease_gen', 1)
hset(job, 'lease_owner', ARGV[2])
renew(job, KEYS[2], KEYS[4], expires)
redis.call('HDEL', KEYS[3], 'w:' .. f[3])
return {0, gen, tonumber(f[4]), f[5], f[6], now, f[7] == '1' and 1 or 0, tonumber(f[8]), f[9] or ''}
