-- collect-claim: a worker takes a job whose prompt ended at the provider, to store
-- its outputs and finish it (fenced), and books what the prompt cost in the same step.
--
-- Guarantees: only a job the watcher holds (handed over by `await`) is taken, so a
-- duplicated collect message, or one for a job already collected, reconciled or
-- finished, takes nothing; the generation goes up, so the watcher's renewals stop
-- counting; the job leaves the watch list. The collector's lease is the record's (`renew` in
-- _lib.lua: the leases index keeps its earlier entry). When the caller read the prompt's end
-- at the provider before this call (ARGV[4], the operation it read, is the job's current one),
-- the cost it reported (ARGV[5]) is booked here, as the charge step would (`charge_attempt` in
-- _lib.lua: once per attempt), so it is on record before any output is fetched.
--
-- keys: 8
-- KEYS[1] job record (hash)          KEYS[3] fleet (hash)
-- KEYS[2] tenant's leases (zset)     KEYS[4] wake set (zset)
-- KEYS[5] tenant ledger (hash)
-- KEYS[6] global stats (hash), KEYS[7] queue (zset), KEYS[8] due (zset): see use_globals in _lib.lua
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] worker id
-- ARGV[3] lease length (ms)
-- ARGV[4] operation id whose end the caller read at the provider ('' for none)
-- ARGV[5] cost units that operation charged (outputs x its server's price, plus its seconds x its
--   price per second)
-- ARGV[6] `<attempt>:<ms>`, the execution those seconds are ('' none: priced per output only)
--
-- Returns {0 OK, generation, attempt number, operation id, server, now (ms), cancel requested
--   (0|1), deadline (ms), provider epoch at submission, units booked here (-1: none asked or
--   another operation's), units beyond what the job held}
--   | {8 NOT_CLAIMABLE, state} | {7 NOT_FOUND}

use_globals(6)
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
local booked, over = -1, 0
if ARGV[4] ~= '' and ARGV[4] == f[5] then booked, over = charge_attempt(job, KEYS[5], tonumber(ARGV[5]), ARGV[6]) end
return {0, gen, tonumber(f[4]), f[5], f[6], now, f[7] == '1' and 1 or 0, tonumber(f[8]), f[9] or '', booked, over}
