-- slot-take: takes one of a server's dispatch slots for a job, before the job's claim, when the
-- state is split into shards (each shard's claims take slots in their own fleet hash, so only this
-- key, one per server with its own hash tag, holds a server's cap across shards).
--
-- Guarantees: at most `cap` jobs hold a slot of the server at once, each a lease on this key's
-- Redis clock: a slot whose lease lapsed (a worker died between this take and its claim) is free
-- again. An attempt that holds one already keeps it (its lease renewed): a repeated take is one slot.
--
-- Turns across shards (pipeline/state/calls.py): a shard whose job parked for want of a slot waits for
-- the server (KEYS[2], lua/slot-wait.lua); an unpark's call reserves its slot here at once (member
-- `<job id>/call`, ARGV[6] = 1), which moves its shard's turn behind every other waiting shard's; the
-- called job's own take then takes that reservation over (ARGV[5]). A freed slot calls the waiting
-- shards lowest turn first, so shards with jobs parked take turns.
--
-- keys: 2
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>`, or `<job id>/call` for a call's
--         reservation -> when its lease lapses, ms)
-- KEYS[2] the shards waiting for the server's slots (zset: shard number -> turn)
--
-- ARGV[1] the server's cap (prompts in flight)
-- ARGV[2] the attempt: `<job id>/<operation id>` (a reservation: `<job id>/call`)
-- ARGV[3] lease length (ms)
-- ARGV[4] the taker's shard number (for a reservation's turn; else '')
-- ARGV[5] the reservation of the job's call to take over, `<job id>/call` ('' = none)
-- ARGV[6] 1 if this take reserves a slot for a call (its shard's turn goes last), else ''
--
-- Returns {0 OK, 1 taken | 2 held already (renewed) | 0 full}

local now = clock('')
if ARGV[5] ~= '' and redis.call('ZREM', KEYS[1], ARGV[5]) == 1 then  -- its call's slot: now this attempt's
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  return {0, 1}
end
local held = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then  -- full, unless some lapsed
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {0, 0} end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
if ARGV[6] == '1' then  -- served: behind every other waiting shard
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], (tonumber(last[2]) or 0) + 1, ARGV[4])
end
return {0, held and 2 or 1}
