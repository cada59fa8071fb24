-- webhook-redeliver: makes exhausted deliveries to one endpoint due now, each with its tries counted from 0
-- again (its retry window starts at its next try: an operator's `reckon webhook redeliver`). A message
-- that is not exhausted (delivered meanwhile, or never) is skipped. Order per job is not waited for here:
-- each redelivered event goes at once, out of its job's line.
--
-- keys: 4
-- KEYS[1] the endpoint's exhausted deliveries (zset: message id -> when)
-- KEYS[2] deliveries (hash)   KEYS[3] the endpoint's due deliveries (zset)
-- KEYS[4] ready endpoints (zset: endpoint -> when its earliest delivery is due, ms)
--
-- ARGV[1] endpoint id   ARGV[2] onwards: message ids
--
-- Returns {0 OK, deliveries made due}

local now, count = clock(''), 0
for i = 2, #ARGV do
  local member = ARGV[1] .. '/' .. ARGV[i]
  local raw = redis.call('HGET', KEYS[2], member)
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 and raw then
    local delivery = cjson.decode(raw)
    delivery.state, delivery.attempts, delivery.exhausted_at = 'pending', 0, nil
    delivery.unordered = true  -- its outcome moves no job's line (lua/webhook-done.lua)
    redis.call('HSET', KEYS[2], member, cjson.encode(delivery))
    redis.call('ZADD', KEYS[3], now, member)
    count = count + 1
  end
end
if count > 0 then redis.call('ZADD', KEYS[4], 'LT', now, ARGV[1]) end
return {0, count}
