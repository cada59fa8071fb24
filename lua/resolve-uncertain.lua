-- resolve-uncertain: reconciliation learned whether the unknown attempt executed (fenced).
--
-- Guarantees: the job's uncertain units become charged (it executed) or go back
-- to its reservation (it never did), on the job and the tenant ledger at once.
--
-- keys: 5
-- KEYS[1] job record (hash)
-- KEYS[2] tenant ledger (hash)
--
-- KEYS[3] global stats (hash), KEYS[4] queue (zset), KEYS[5] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] 1 if the attempt executed, 0 if it never did
--
-- Returns {0 OK, units moved} | {9 STALE_LEASE}

use_globals(3)
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local to = (ARGV[2] == '1') and 'charged' or 'reserved'
return {0, resolve_hold(KEYS[1], KEYS[2], to)}
