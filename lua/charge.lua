-- charge: the provider reported what this attempt produced; book its cost now (fenced).
--
-- Guarantees: the cost of what the provider produced is booked (reserved ->
-- charged) before any output is fetched, so a worker that dies after this point
-- leaves no doubt about it; booked once per attempt. Whatever was held as
-- uncertain for the attempt is resolved in the same step (the provider's own
-- report replaces the guess), so it can never be settled on top of the charge.
-- The charge is booked in full, at the price of the server that ran the attempt (the
-- caller's units). More than the job still holds is an invariant violation (admission
-- reserves at the fleet's highest price; a fleet changed since, or a graph that makes
-- more images than the job asked for, can pass it): the
-- money was spent, so the excess is booked too (charged, the tenant's `reserved`, later
-- settled), recorded on the job (`overrun`, units) and counted (`charge_overruns_total`
-- in the global stats); the caller logs it as an error. Never silently cut.
--
-- keys: 5
-- KEYS[1] job record (hash)
-- KEYS[2] tenant ledger (hash)
--
-- KEYS[3] global stats (hash), KEYS[4] queue (zset), KEYS[5] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] cost units the provider charged for this attempt (outputs x its server's price, plus its
--   seconds x its price per second: docs/costs.md)
-- ARGV[3] `<attempt>:<ms>`, the execution those seconds are ('' for a server priced per output only)
--
-- Returns {0 OK, units booked, units beyond what the job held (0: none)} | {9 STALE_LEASE}

use_globals(3)
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local units, over = charge_attempt(KEYS[1], KEYS[2], tonumber(ARGV[2]), ARGV[3])
return {0, units, over}
