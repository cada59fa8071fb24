-- slot-take: takes one of a server's dispatch slots for a job, before the job's claim, when the
-- state is split into shards (each shard's claims take slots in their own fleet hash, so only this
-- key, one per server with its own hash tag, holds a server's cap across shards).
--
-- Guarantees: at most `cap` jobs hold a slot of the server at once, each a lease on this key's
-- Redis clock: a slot whose lease lapsed (a worker died between this take and its claim) is free
-- again. An attempt that holds one already keeps it (its lease renewed): a repeated take is one slot.
--
-- keys: 1
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>` -> when its lease lapses, ms)
--
-- ARGV[1] the server's cap (prompts in flight)
-- ARGV[2] the attempt: `<job id>/<operation id>`
-- ARGV[3] lease length (ms)
--
-- Returns {0 OK, 1 taken | 2 held already (renewed) | 0 full}

local now = clock('')
local held = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then  -- full, unless some lapsed
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {0, 0} end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
return {0, held and 2 or 1}
