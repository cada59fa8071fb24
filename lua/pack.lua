-- pack: a finished job kept in several keys (written before finished jobs were packed, or put back
-- in them by `reckon keys migrate` from an earlier packed form) becomes one key, as `finalize` packs a
-- job that ends now (`pack_finished` in _lib.lua).
--
-- keys: 7
-- KEYS[1] job record (hash)
-- KEYS[2] to KEYS[6] its parts (`parts_at` in _lib.lua)   KEYS[7] its workflow (string)
--
-- Returns {0, 1} packed | {0, 0} nothing to pack (not completed or cancelled, or packed already)
--   | {7 NOT_FOUND}

local f = redis.call('HMGET', KEYS[1], 'state', 'z')
if not f[1] then return {7} end
if (f[1] ~= 'completed' and f[1] ~= 'cancelled') or f[2] then return {0, 0} end
PACKS[KEYS[1]] = {workflow = KEYS[7], parts = parts_at(2)}
return {0, 1}
