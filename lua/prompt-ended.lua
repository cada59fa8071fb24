-- prompt-ended: the watcher heard the job's prompt end at its server (ComfyUI's `executing` with node
-- null, sent once the prompt left its queue, or a history read that finds it ended): the server is free
-- now, not once reckon has collected the outputs, stored them and settled (collecting is not GPU work),
-- so the job's dispatch slot is given back here, and the collect that follows gives nothing back again.
--
-- Guarantees: only the slot of the prompt that ended (the record's `operation_id` is ARGV[1]: another
-- attempt's slot is never given back), and once (`slot_held` 0 after it: finish, retry and review
-- give back only a slot still held). The watch of the prompt stays: the collect takes it from there.
--
-- keys: 3
-- KEYS[1] job record (hash)   KEYS[2] fleet (hash: `busy:<server>`)   KEYS[3] parked (zset)
--
-- ARGV[1] the operation id of the prompt that ended
--
-- Returns {0 OK, jobs parked in the shard} when it gave the slot back | {1} when there was none to give

local f = redis.call('HMGET', KEYS[1], 'server', 'slot_held', 'operation_id')
if f[2] ~= '1' or f[3] ~= ARGV[1] then return {1} end
redis.call('HSET', KEYS[1], 'slot_held', 0)
redis.call('HINCRBY', KEYS[2], 'busy:' .. f[1], -1)
return {0, redis.call('ZCARD', KEYS[3])}
