-- slot-let-go: the prompt a review left at its server is gone (the server says it ended, or has no
-- record of it, or an operator says the server is gone for good: `reckon provider forget`): the slot
-- kept for it is given back, and what the server said books the hold the review left uncertain.
--
-- Guarantees: a kept slot is given back once (a second call, from another watcher or a repeated
-- check, finds no entry and changes nothing), and only a kept one: the slots of live attempts are
-- the records' (`slot_held`), never touched here. The `k:` entry is the booking's id: the hold is
-- booked in the same call that removes it, so at most once. The server said the prompt completed
-- (ARGV[2] = 1) and the job still waits for its review with that attempt: it ran, and the provider
-- bills a whole run, so the job's uncertain units become charged (settled when the review ends, and a
-- later `--retry` no longer returns them). Any other word (failed, no record of it) leaves the hold
-- uncertain, as for any unknown outcome: the operator decides (docs/costs.md).
--
-- keys: 6
-- KEYS[1] fleet (hash): `k:<job id>/<operation id>` -> {server, since} (`keep_slot` in _slots.lua)
-- KEYS[2] the job's record (hash)
-- KEYS[3] the job's tenant's ledger (hash)
-- KEYS[4] global stats (hash: the ledger's totals), KEYS[5] queue (zset), KEYS[6] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] the kept slot: `<job id>/<operation id>`
-- ARGV[2] 1: the server says the prompt completed | '' or 0: it failed, or has no record of it
--
-- Returns {0 OK, 1 given back | 0 not kept (any more), units booked as charged}

use_globals(4)
local raw = redis.call('HGET', KEYS[1], 'k:' .. ARGV[1])
if not raw then return {0, 0, 0} end
redis.call('HDEL', KEYS[1], 'k:' .. ARGV[1])
add(KEYS[1], 'busy:' .. cjson.decode(raw).server, -1)
local booked = 0
if ARGV[2] == '1' then
  local f = hmget(KEYS[2], 'state', 'id', 'operation_id', 'uncertain')
  if f[1] == 'needs_review' and (f[2] or '') .. '/' .. (f[3] or '') == ARGV[1] then
    booked = resolve_hold(KEYS[2], KEYS[3], 'charged')
  end
end
return {0, 1, booked}
