-- slot-take: takes one of a server's dispatch slots for a job, before the job's claim, when the
-- state is split into shards (each shard's claims take slots in their own fleet hash, so only this
-- key, one per server with its own hash tag, holds a server's cap across shards).
--
-- Guarantees: at most `cap` attempts hold a slot of the server at once. A slot never lapses here: it
-- lives while its attempt's job record names it (or a review keeps it for a prompt that may still
-- occupy the server), and only the sweeper, which reads those, frees one nobody holds (slot-keep.lua).
-- An attempt that holds one already keeps it (its score raised): a repeated take is one slot.
--
-- keys: 1
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>` -> when taken or last renewed, ms)
--
-- ARGV[1] the server's cap (prompts in flight)
-- ARGV[2] the attempt: `<job id>/<operation id>`
--
-- Returns {0 OK, 1 taken | 2 held already (renewed) | 0 full}

local now = clock('')
local held = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]) or '')
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {0, 0} end
redis.call('ZADD', KEYS[1], math.max((held or 0) + 1, now), ARGV[2])
return {0, held and 2 or 1}
