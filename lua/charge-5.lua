-- charge: the provider reported what this attempt produced; book its cost now (fenced).
--
-- Guarantees: the cost of what the provider produced is booked (reserved ->
-- charged) before any output is fetched, so a worker that dies after this point
-- leaves no doubt about it; booked once per attempt. Whatever was held as
-- uncertain for the attempt is resolved in the same step (the provider's own
-- report replaces the guess), so it can never be settled on top of the charge.
--
-- KEYS[1] job record (hash)
-- KEYS[2] tenant ledger (hash)
--
-- KEYS[3] global stats (hash), KEYS[4] queue (zset), KEYS[5] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] cost units the provider charged for this attempt
--
-- Returns {0 OK, units booked} | {9 STALE_LEASE}

use_globals(3)
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
if redis.call('HGET', KEYS[1], 'attempt_charged') == '1' then return {0, 0} end
redis.call('HSET', KEYS[1], 'attempt_charged', 1)
shift(KEYS[1], KEYS[2], 'uncertain', 'reserved', redis.call('HGET', KEYS[1], 'uncertain') or '0')
return {0, shift(KEYS[1], KEYS[2], 'reserved', 'charged', ARGV[2])}
