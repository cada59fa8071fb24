-- unpark: takes as many parked jobs as the fleet has free dispatch slots, for the
-- caller to publish again (best priority, then oldest, first).
--
-- Guarantees: never more jobs than free slots on usable servers, so a full fleet
-- is not polled; a job taken here is still `queued` in its tenant's index, so if
-- the caller dies before publishing, the sweeper's redelivery publishes it.
--
-- KEYS[1] fleet (hash)
-- KEYS[2] fleet's parked jobs (zset; score: 1e13 for batch, plus queued time in ms)
--
-- ARGV[1], ARGV[2], ... server name, its cap, for each server
--
-- Returns {0 OK, job id, score, job id, score, ...}. The caller publishes them to the
-- `reckon-unparked` queue, which workers serve before their other queues, so a parked
-- job does not wait again behind the backlog that arrived after it.

if redis.call('ZCARD', KEYS[2]) == 0 then return {0} end
local servers = {}
for i = 1, #ARGV, 2 do servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])} end
local free = free_slots(KEYS[1], servers)
local reply = {0}
if free == 0 then return reply end
for _, item in ipairs(redis.call('ZPOPMIN', KEYS[2], free)) do reply[#reply + 1] = item end
return reply
