-- slot-keep: renews the slots of a server that attempts still hold, and frees the ones nobody holds,
-- as the sweeper read them (an attempt holds the slot its job's record names: `server`, `slot_held`,
-- `operation_id`; a review keeps it for a prompt that may still occupy the server: `k:<job id>/<operation
-- id>` in the job's shard's fleet hash). Also the check a worker makes after its claim, before it sends
-- (`confirm`: renews its slot, and says whether it still has one).
--
-- Guarantees: a slot is never freed by its age alone (a sweeper stalled for minutes, then its first
-- pass, still renews every slot a record names before anything is freed); it is freed only when the
-- caller read that nobody holds it, and only if its score is still the one read: each renewal raises
-- the score, so a slot confirmed after the sweeper's read is never freed by it. A slot nobody holds is
-- freed only once `grace` ms passed since it was taken or last renewed (a take is followed by its claim
-- within that; a claim that comes later finds its slot gone when it confirms, and gives the attempt
-- back before anything is sent). A renewal never takes again a slot freed meanwhile. A call's
-- reservation (`<job id>/call`, lua/slot-take.lua) is held by no record: it is scored by when it lapses
-- and freed once that passed (its called job's take took it over before, or never will).
--
-- keys: 1
-- KEYS[1] the server's slots (zset: `<job id>/<operation id>` -> when taken or last renewed, ms;
--         `<job id>/call` -> when the reservation lapses, ms)
--
-- ARGV[1] grace (ms)
-- ARGV[2], ARGV[3], ARGV[4], ... for each slot: its member, 1 if it is held (renew) | 0 if not
--   (free after the grace), the score the caller read ('' for a renewal)
--
-- Returns {0 OK, slots freed, 1 if the first slot is still taken | 0}

local now = clock('')
local grace = tonumber(ARGV[1])
local freed, first = 0, 0
for i = 2, #ARGV, 3 do
  local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or '')
  if score and ARGV[i + 1] == '1' then
    redis.call('ZADD', KEYS[1], math.max(score + 1, now), ARGV[i])
  elseif score and tostring(score) == tostring(tonumber(ARGV[i + 2]))
      and (string.sub(ARGV[i], -5) == '/call' and score or score + grace) <= now then
    redis.call('ZREM', KEYS[1], ARGV[i])
    freed, score = freed + 1, nil
  end
  if i == 2 and score then first = 1 end
end
return {0, freed, first}
