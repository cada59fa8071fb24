-- reconcile-begin: a running job whose outcome is unknown goes to `reconciling`.
--
-- Two callers: the worker, fenced by its generation, when the provider may have
-- accepted the request; and the sweeper, with no generation, when the lease
-- expired on Redis's clock (evidence that the worker stopped reporting, not that
-- the provider stopped). Either way the lease ends and the generation goes up:
-- the worker of the unknown attempt, stalled or not, can no longer write. If the
-- attempt was submitted and its charge is not yet booked, what the provider can bill for it
-- moves from reserved to uncertain until reconciliation resolves it: a whole run, every
-- output of the job (ComfyUI runs the whole graph for a prompt, whichever outputs were still
-- missing), at its server's price (`attempt_price`, recorded by the claim; a job claimed
-- before claims recorded it: its own `price`), plus, for a job priced by the second, its
-- `max_seconds` x its `price_per_second` (the highest of the servers it may run on, recorded at
-- admission: docs/costs.md "Per-second prices"). A run beyond what the job still holds is held
-- in full too (the tenant's available units may go below zero): never booked below what the
-- provider may have charged.
-- A renewal writes only the record's expiry (`renew` in _lib.lua), so the sweeper finds a
-- renewed lease's entry due early: then the entry (and the tenant's wake entry) moves to the
-- record's expiry, and nothing else changes (NOT_DUE).
-- The job keeps its dispatch slot (its prompt may still occupy the server) but
-- leaves the watch list: reconciliation asks the server from now on.
--
-- keys: 12
-- KEYS[1] job record (hash)          KEYS[5] job's event list
-- KEYS[2] tenant ledger (hash)       KEYS[6] tenant's per-state counts (hash)
-- KEYS[3] tenant's leases (zset)     KEYS[7] tenant's reconcile index (zset)
-- KEYS[4] job's attempts (hash)      KEYS[8] wake set (zset)
--                                    KEYS[9] fleet (hash)
--
-- KEYS[10] global stats (hash), KEYS[11] queue (zset), KEYS[12] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] lease generation held by the caller, or '' for lease expiry
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] delay before the first reconciliation (ms)
-- ARGV[4] reason (e.g. unknown_outcome, lease_expired)
--
-- Returns {0 OK, uncertain units} | {9 STALE_LEASE} | {11 NOT_DUE} | {7 NOT_FOUND}

use_globals(10)
local job, now = KEYS[1], clock(ARGV[2])
local f = hmget(job, 'state', 'lease_gen', 'lease_expires', 'id', 'submitted',
  'outputs_requested', 'price', 'attempt_charged', 'attempt_price', 'max_seconds', 'price_per_second')
if ARGV[1] ~= '' then
  if f[1] ~= 'running' or f[2] ~= ARGV[1] then return {9} end
else
  if f[1] ~= 'running' then
    if f[4] then redis.call('ZREM', KEYS[3], f[4]) end
    return {7}
  end
  if tonumber(f[3]) > now then  -- renewed since its entry was written: the entry moves to the expiry
    redis.call('ZADD', KEYS[3], f[3], f[4])
    wake(KEYS[8], job, f[3])
    return {11}
  end
end

local held = 0
if f[5] == '1' and f[8] ~= '1' then
  local run = tonumber(f[6]) * tonumber(f[9] or f[7]) + tonumber(f[10] or '0') * tonumber(f[11] or '0')
  held = shift(job, KEYS[2], 'reserved', 'uncertain', run)
  if held < run then  -- beyond what the job holds: held all the same
    hincrby(job, 'uncertain', run - held)
    ledger_add(KEYS[2], 'uncertain', run - held)
    held = run
  end
end
end_attempt(job, KEYS[4], now, 'unknown', ARGV[4])
release(job, KEYS[3], f[4])
redis.call('HDEL', KEYS[9], 'w:' .. f[4])
redis.call('ZADD', KEYS[7], now + tonumber(ARGV[3]), f[4])
wake(KEYS[8], job, now + tonumber(ARGV[3]))
hset(job, 'reconcile_since', now, 'reconcile_claims', 0, 'sends', 0)
if ARGV[4] == 'lease_expired' then redis.call('HINCRBY', G.stats, 'leases_expired_total', 1) end
move(job, KEYS[6], KEYS[5], now, 'running', 'reconciling', ARGV[4])
return {0, held}
