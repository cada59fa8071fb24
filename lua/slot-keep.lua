-- slot-keep: renews the slots of a server that jobs still hold, and frees the ones they do not,
-- as the sweeper read the jobs (a job's record says which server's slot it holds: `server`,
-- `slot_held`); with the lapsed ones.
--
-- Guarantees: a slot is renewed only if it is still taken (a slot freed meanwhile is not taken
-- again); a slot a job does not hold is freed only once `grace` ms passed since it was taken (a
-- take is followed by its claim within that; a claim that comes later finds its slot gone when
-- it confirms, and gives the attempt back before anything is sent).
--
-- keys: 1
-- KEYS[1] the server's slots (zset: job id -> when its lease lapses, ms)
--
-- ARGV[1] lease length (ms)
-- ARGV[2] grace (ms)
-- ARGV[3], ARGV[4], ... job id, 1 if it holds the slot (renew) | 0 if not (free after the grace)
--
-- Returns {0 OK, slots freed}

local now = clock('')
local lease, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
local freed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 3, #ARGV, 2 do
  local until_ms = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or '')
  if until_ms and ARGV[i + 1] == '1' then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  elseif until_ms and until_ms - lease + grace <= now then
    redis.call('ZREM', KEYS[1], ARGV[i])
    freed = freed + 1
  end
end
return {0, freed}
