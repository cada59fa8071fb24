-- unpark: calls as many parked jobs as the fleet has slots free and not yet promised,
-- for the caller to publish again (best priority, then the fairest: lowest finish tag, first).
--
-- Guarantees: a called job is promised a slot until it claims (or `call` ms pass: its
-- message was lost), so unparks that run before it arrives call nobody else for the
-- same slot: no job is published without a slot for it, and a full fleet is not
-- polled. A called job stays in the parked set, in its place, until it claims: if its
-- call lapses, a later unpark calls it again first.
--
-- keys: 3
-- KEYS[1] fleet (hash)
-- KEYS[2] fleet's parked jobs (zset; score: 1e13 for batch, plus the job's finish tag)
-- KEYS[3] fleet's called jobs (zset; score: when the promise lapses, ms)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] how long a call holds its slot (ms)
-- ARGV[3], ARGV[4], ... server name, its cap, for each server
--
-- Jobs of a paused class (`pause_class:<class>` in the fleet hash) are not called.
--
-- Returns {0 OK, job id, score, job id, score, ...}. The caller publishes them to the
-- `reckon-unparked` queue, which workers serve before their other queues, so a parked
-- job does not wait again behind the backlog that arrived after it.

if redis.call('ZCARD', KEYS[2]) == 0 then return {0} end
local now = clock(ARGV[1])
local servers = {}
for i = 3, #ARGV, 2 do servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])} end
fleet_view(KEYS[1], servers)
local calls = promised(KEYS[3], KEYS[2], now)
local open = free_slots(KEYS[1], servers) - #calls
local reply = {0}
local low = paused_for(KEYS[1], 'interactive') and BATCH_RANK or '-inf'
local high = paused_for(KEYS[1], 'batch') and '(' .. BATCH_RANK or '+inf'
if open <= 0 or (low ~= '-inf' and high ~= '+inf') then return reply end
local best = redis.call('ZRANGEBYSCORE', KEYS[2], low, high, 'WITHSCORES', 'LIMIT', 0, open + #calls)
for i = 1, #best, 2 do
  if #reply > 2 * open then break end
  if not redis.call('ZSCORE', KEYS[3], best[i]) then  -- not called already
    reply[#reply + 1], reply[#reply + 2] = best[i], best[i + 1]
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), best[i])
  end
end
return reply
