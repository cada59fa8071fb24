-- slot-take: takes one of a server's dispatch slots for a job, before the job's claim, when the
-- state is split into shards (each shard's claims take slots in their own fleet hash, so only this
-- key, one per server with its own hash tag, holds a server's cap across shards).
--
-- Guarantees: at most `cap` attempts and calls hold a slot of the server at once. An attempt's slot
-- never lapses here: it lives while its attempt's job record names it (or a review keeps it for a
-- prompt that may still occupy the server), and only the sweeper, which reads those, frees one nobody
-- holds (slot-keep.lua). An attempt that holds one already keeps it (its score raised): a repeated
-- take is one slot.
--
-- Turns across shards (pipeline/state/calls.py): a shard whose job parked for want of a slot waits for
-- the server (KEYS[2], lua/slot-wait.lua); an unpark's call reserves its slot here at once (member
-- `<job id>/call`, ARGV[5] its lapse length), which moves its shard's turn behind every other waiting
-- shard's; the called job's own take then takes that reservation over (ARGV[4]). A reservation is a
-- promise: scored by when it lapses, and a take that finds the server full removes the lapsed ones
-- (only members `<job id>/call`, never an attempt's slot). A freed slot calls the waiting shards
-- lowest turn first, so shards with jobs parked take turns.
--
-- keys: 2
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>` -> when taken or last renewed, ms;
--         `<job id>/call`, a call's reservation -> when it lapses, ms)
-- KEYS[2] the shards waiting for the server's slots (zset: shard number -> turn)
--
-- ARGV[1] the server's cap (prompts in flight)
-- ARGV[2] the attempt: `<job id>/<operation id>` (a reservation: `<job id>/call`)
-- ARGV[3] the taker's shard number (for a reservation's turn; else '')
-- ARGV[4] the reservation of the job's call to take over, `<job id>/call` ('' = none)
-- ARGV[5] for a reservation, how long it holds the slot for its call (ms; its shard's turn goes
--         last); '' for an attempt
--
-- Returns {0 OK, 1 taken | 2 held already (renewed) | 0 full}

local now = clock('')
if ARGV[4] ~= '' and redis.call('ZREM', KEYS[1], ARGV[4]) == 1 then  -- its call's slot: now this attempt's
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  return {0, 1}
end
local call = ARGV[5] ~= ''
local held = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]) or '')
if not held and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then  -- full, unless a reservation lapsed
  local lapsed = 0
  for _, slot in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
    if string.sub(slot, -5) == '/call' then lapsed = lapsed + redis.call('ZREM', KEYS[1], slot) end
  end
  if lapsed == 0 or redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {0, 0} end
end
if call then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[2])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')  -- served: behind every other waiting shard
  redis.call('ZADD', KEYS[2], (tonumber(last[2]) or 0) + 1, ARGV[3])
else
  redis.call('ZADD', KEYS[1], math.max((held or 0) + 1, now), ARGV[2])
end
return {0, held and 2 or 1}
