-- webhook-fanout: turns the webhook events a webhooks process took from the outbox into one delivery
-- per endpoint that wants each, and drops those events, as one step: an event is never lost between the
-- outbox and its deliveries, nor fanned out twice (a delivery already there is left as it is). A job's
-- deliveries to one endpoint go one at a time in event order: a later one waits in the job's line
-- (`webhook_order`) until the one before it is delivered, dropped or exhausted (lua/webhook-done.lua); a
-- progress delivery waiting last in a line is replaced by a newer one (`p|` marks it), so a line holds at
-- most the job's state events and one progress point. Then the next events are moved from the outbox to
-- the taking list, so a busy outbox costs no blocking wait per event.
--
-- keys: 5 or more
-- KEYS[1] taking list (the events being fanned out, in order)
-- KEYS[2] webhook outbox (list)
-- KEYS[3] deliveries (hash: `<endpoint>/<message>` -> JSON)
-- KEYS[4] order (hash: `<endpoint>/<job>` -> JSON list of deliveries waiting behind the one tried)
-- KEYS[5] ready endpoints (zset: endpoint -> when its earliest delivery is due, ms)
-- then one due set per endpoint (zset: `<endpoint>/<message>` -> when, ms), each delivery naming its own
--
-- ARGV[1] how many events from the head of the taking list this call fans out (n)
-- ARGV[2] JSON list of deliveries {endpoint, message, job, type, due (its due set's index in KEYS), ...}
-- ARGV[3] how many events to move from the outbox to the taking list afterwards
-- ARGV[4] to ARGV[3 + n] the events as read (a call that read another process's list refuses: 8)
--
-- Returns {0 OK, deliveries made, events moved} | {8 NOT_CLAIMABLE} (the list's head changed)

local n = tonumber(ARGV[1])
if n > 0 then
  local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
  if #head ~= n then return {8} end
  for i = 1, n do
    if head[i] ~= ARGV[3 + i] then return {8} end
  end
end
local now, made = clock(''), 0
for _, delivery in ipairs(cjson.decode(ARGV[2])) do
  local member, due = delivery.endpoint .. '/' .. delivery.message, KEYS[delivery.due]
  delivery.attempts, delivery.state, delivery.due = 0, 'pending', nil
  if redis.call('HSETNX', KEYS[3], member, cjson.encode(delivery)) == 1 then
    made = made + 1
    local line = delivery.endpoint .. '/' .. delivery.job
    local entry = (delivery.type == 'job.progress' and 'p|' or '') .. member
    local waiting = redis.call('HGET', KEYS[4], line)
    if waiting then
      waiting = cjson.decode(waiting)
      local last = waiting[#waiting]
      if entry:sub(1, 2) == 'p|' and last and last:sub(1, 2) == 'p|' then
        redis.call('HDEL', KEYS[3], last:sub(3))  -- a newer progress point replaces the one waiting
        waiting[#waiting] = entry
      else
        waiting[#waiting + 1] = entry
      end
      redis.call('HSET', KEYS[4], line, cjson.encode(waiting))
    else
      redis.call('HSET', KEYS[4], line, '[]')
      redis.call('ZADD', due, now, member)
      redis.call('ZADD', KEYS[5], 'LT', now, delivery.endpoint)
    end
  end
end
if n > 0 then redis.call('LTRIM', KEYS[1], n, -1) end
local moved = redis.call('LRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1)
if #moved > 0 then
  redis.call('RPUSH', KEYS[1], unpack(moved))
  redis.call('LTRIM', KEYS[2], #moved, -1)
end
return {0, made, #moved}
