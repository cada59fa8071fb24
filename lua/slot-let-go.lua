-- slot-let-go: the prompt a review left at its server is gone (the server says it ended, or has no
-- record of it, or the server is no longer configured): the slot kept for it is given back.
--
-- Guarantees: a kept slot is given back once (a second call, from another watcher or a repeated
-- check, finds no entry and changes nothing), and only a kept one: the slots of live attempts are
-- the records' (`slot_held`), never touched here.
--
-- keys: 1
-- KEYS[1] fleet (hash): `k:<job id>/<operation id>` -> {server, since} (`keep_slot` in _slots.lua)
--
-- ARGV[1] the kept slot: `<job id>/<operation id>`
--
-- Returns {0 OK, 1 given back | 0 not kept (any more)}

local raw = redis.call('HGET', KEYS[1], 'k:' .. ARGV[1])
if not raw then return {0, 0} end
redis.call('HDEL', KEYS[1], 'k:' .. ARGV[1])
add(KEYS[1], 'busy:' .. cjson.decode(raw).server, -1)
return {0, 1}
