-- The end of a webhook delivery, shared by the scripts that end one (lua/webhook-done.lua after a try's
-- outcome, lua/webhook-take.lua for a delivery whose last try's outcome was never written); after _lib.lua
-- in the library's prelude (the loader joins the `lua/_*.lua` files in name order).

-- Ends a delivery that is not tried again: exhausted (kept and listed for redelivery, the newest `kept` of
-- its endpoint) when `exhausted`, else removed (delivered or dropped). Then the job's next delivery to that
-- endpoint, if one waits in the job's line, becomes due (a redelivered delivery is out of line: it moves
-- none), and the endpoint leaves the ready set if nothing of it is due. `k` names the keys: `due` (the
-- endpoint's due set), `deliveries`, `order`, `exhausted` (the endpoint's), `ready`. Returns 1 when the
-- job's next delivery became due, else 0.
local function end_delivery(k, member, delivery, exhausted, now, kept)
  redis.call('ZREM', k.due, member)
  if exhausted then
    delivery.state, delivery.exhausted_at, delivery.lease = 'exhausted', now, nil
    redis.call('HSET', k.deliveries, member, cjson.encode(delivery))
    redis.call('ZADD', k.exhausted, now, delivery.message)
    local over = redis.call('ZCARD', k.exhausted) - kept
    if over > 0 then
      for _, message in ipairs(redis.call('ZRANGE', k.exhausted, 0, over - 1)) do
        redis.call('HDEL', k.deliveries, delivery.endpoint .. '/' .. message)
      end
      redis.call('ZREMRANGEBYRANK', k.exhausted, 0, over - 1)
    end
  else
    redis.call('HDEL', k.deliveries, member)
  end
  local line = delivery.endpoint .. '/' .. delivery.job
  local waiting, next_due = nil, 0
  if not delivery.unordered then waiting = redis.call('HGET', k.order, line) end
  if waiting then
    waiting = cjson.decode(waiting)
    if #waiting == 0 then
      redis.call('HDEL', k.order, line)
    else
      local entry = table.remove(waiting, 1)
      if entry:sub(1, 2) == 'p|' then entry = entry:sub(3) end
      redis.call('ZADD', k.due, now, entry)
      redis.call('ZADD', k.ready, 'LT', now, delivery.endpoint)
      redis.call('HSET', k.order, line, cjson.encode(waiting))
      next_due = 1
    end
  end
  if next_due == 0 and redis.call('ZCARD', k.due) == 0 then redis.call('ZREM', k.ready, delivery.endpoint) end
  return next_due
end
