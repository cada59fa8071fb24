-- unpark: calls as many parked jobs as the fleet has slots free and not yet promised,
-- for the caller to publish again (best priority, then oldest, first).
--
-- Guarantees: a called job is promised a slot until it claims (or `call` ms pass: its
-- message was lost), so unparks that run before it arrives call nobody else for the
-- same slot: no job is published without a slot for it, and a full fleet is not
-- polled. A called job is still `queued` in its tenant's index, so if the caller dies
-- before publishing, the sweeper's redelivery publishes it.
--
-- KEYS[1] fleet (hash)
-- KEYS[2] fleet's parked jobs (zset; score: 1e13 for batch, plus admission time in ms)
-- KEYS[3] fleet's called jobs (zset; score: when the promise lapses, ms)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] how long a call holds its slot (ms)
-- ARGV[3], ARGV[4], ... server name, its cap, for each server
--
-- Returns {0 OK, job id, score, job id, score, ...}. The caller publishes them to the
-- `reckon-unparked` queue, which workers serve before their other queues, so a parked
-- job does not wait again behind the backlog that arrived after it.

if redis.call('ZCARD', KEYS[2]) == 0 then return {0} end
local now = clock(ARGV[1])
local servers = {}
for i = 3, #ARGV, 2 do servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])} end
local open = free_slots(KEYS[1], servers) - promised(KEYS[3], now)
local reply = {0}
if open <= 0 then return reply end
for i, item in ipairs(redis.call('ZPOPMIN', KEYS[2], open)) do
  reply[#reply + 1] = item
  if i % 2 == 1 then redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), item) end
end
return reply
