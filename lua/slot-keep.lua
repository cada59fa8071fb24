-- slot-keep: renews the slots of a server that attempts still hold, and frees the ones they do not,
-- as the sweeper read them (an attempt holds the slot its job's record names: `server`, `slot_held`,
-- `operation_id`); with the lapsed ones. Also the check a worker makes after its claim, before it
-- sends (`confirm`: renews its slot, and says whether it still has one).
--
-- Guarantees: a slot is renewed only if it is still taken (one freed meanwhile is not taken again),
-- and each renewal raises its score, so the sweeper, which frees a slot only if its score is still
-- the one it read with the record, never frees a slot confirmed after that read. A slot no attempt
-- holds is freed only once `grace` ms passed since it was taken or last renewed (a take is followed
-- by its claim within that; a claim that comes later finds its slot gone when it confirms, and gives
-- the attempt back before anything is sent).
--
-- keys: 1
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>` -> when its lease lapses, ms)
--
-- ARGV[1] lease length (ms)
-- ARGV[2] grace (ms)
-- ARGV[3], ARGV[4], ARGV[5], ... for each slot: its member, 1 if its attempt holds it (renew) | 0 if not
--   (free after the grace), the score the caller read ('' for a renewal)
--
-- Returns {0 OK, slots freed, 1 if the first slot is still taken | 0}

local now = clock('')
local lease, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
local freed = 0
if #ARGV > 5 or ARGV[5] ~= '' then freed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end  -- not for a check
local first = 0
for i = 3, #ARGV, 3 do
  local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or '')
  if score and ARGV[i + 1] == '1' then
    redis.call('ZADD', KEYS[1], math.max(score + 1, now + lease), ARGV[i])
  elseif score and tostring(score) == tostring(tonumber(ARGV[i + 2])) and score - lease + grace <= now then
    redis.call('ZREM', KEYS[1], ARGV[i])
    freed, score = freed + 1, nil
  end
  if i == 3 and score then first = 1 end
end
return {0, freed, first}
