-- webhook-redeliver: makes exhausted deliveries to one endpoint due now, each with a fresh retry window
-- and its tries counted from 0 again (an operator's `reckon webhook redeliver`). A message that is not
-- exhausted (delivered meanwhile, or never) is skipped. Order per job is not waited for here: each
-- redelivered event goes at once.
--
-- keys: 3
-- KEYS[1] the endpoint's exhausted deliveries (zset: message id -> when)
-- KEYS[2] deliveries (hash)   KEYS[3] due deliveries (zset)
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
    delivery.state, delivery.attempts, delivery.first_at, delivery.exhausted_at = 'pending', 0, now, nil
    delivery.unordered = true  -- its outcome moves no job's line (lua/webhook-done.lua)
    redis.call('HSET', KEYS[2], member, cjson.encode(delivery))
    redis.call('ZADD', KEYS[3], now, member)
    count = count + 1
  end
end
return {0, count}
