-- webhook-done: records the outcome of one try of a delivery under its lease: delivered or dropped (its
-- endpoint is gone) removes it; a failure makes it due again after the caller's delay, unless that is
-- past its retry window (from its first try), when it is exhausted: kept, listed and redelivered on
-- request. Either way the job's next delivery to that endpoint, if one waits, becomes due. A lease that is
-- not the delivery's (it lapsed and another try took it) changes nothing.
--
-- keys: 5
-- KEYS[1] the endpoint's due deliveries (zset)   KEYS[2] deliveries (hash)   KEYS[3] order (hash)
-- KEYS[4] the endpoint's exhausted deliveries (zset: message id -> when, ms)
-- KEYS[5] ready endpoints (zset: endpoint -> when its earliest delivery is due, ms)
--
-- ARGV[1] `<endpoint>/<message>`   ARGV[2] lease token   ARGV[3] delivered | dropped | retry
-- ARGV[4] delay before the next try (ms)   ARGV[5] what went wrong (short text; never a URL)
-- ARGV[6] retry window (ms, from the first try)   ARGV[7] exhausted deliveries kept per endpoint
-- ARGV[8] HTTP status of the try ('' for none)
--
-- Returns {0 OK, delivered | dropped | retry | exhausted, 1 when the job's next delivery became due else 0}
--   | {9 STALE_LEASE}

local member = ARGV[1]
local raw = redis.call('HGET', KEYS[2], member)
if not raw then return {9} end
local delivery = cjson.decode(raw)
if delivery.lease ~= ARGV[2] then return {9} end
local now, outcome = clock(''), ARGV[3]
delivery.lease = nil
delivery.last_at, delivery.last_status = now, tonumber(ARGV[8])
if ARGV[5] ~= '' then delivery.last_error = ARGV[5] end
if outcome == 'retry' then
  local at = now + tonumber(ARGV[4])
  if at > delivery.first_at + tonumber(ARGV[6]) then
    outcome = 'exhausted'
  else
    delivery.next_at = at
    redis.call('HSET', KEYS[2], member, cjson.encode(delivery))
    redis.call('ZADD', KEYS[1], at, member)
    redis.call('ZADD', KEYS[5], 'LT', at, delivery.endpoint)
    return {0, outcome, 0}
  end
end
redis.call('ZREM', KEYS[1], member)
if outcome == 'exhausted' then
  delivery.state, delivery.exhausted_at = 'exhausted', now
  redis.call('HSET', KEYS[2], member, cjson.encode(delivery))
  redis.call('ZADD', KEYS[4], now, delivery.message)
  local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[7])
  if over > 0 then
    for _, message in ipairs(redis.call('ZRANGE', KEYS[4], 0, over - 1)) do
      redis.call('HDEL', KEYS[2], delivery.endpoint .. '/' .. message)
    end
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, over - 1)
  end
else
  redis.call('HDEL', KEYS[2], member)
end
-- the job's next delivery to this endpoint, if one waits (a redelivered one is out of line: it moves none)
local line = delivery.endpoint .. '/' .. delivery.job
local waiting, next_due = nil, 0
if not delivery.unordered then waiting = redis.call('HGET', KEYS[3], line) end
if waiting then
  waiting = cjson.decode(waiting)
  if #waiting == 0 then
    redis.call('HDEL', KEYS[3], line)
  else
    local entry = table.remove(waiting, 1)
    if entry:sub(1, 2) == 'p|' then entry = entry:sub(3) end
    redis.call('ZADD', KEYS[1], now, entry)
    redis.call('ZADD', KEYS[5], 'LT', now, delivery.endpoint)
    redis.call('HSET', KEYS[3], line, cjson.encode(waiting))
    next_due = 1
  end
end
if next_due == 0 and redis.call('ZCARD', KEYS[1]) == 0 then redis.call('ZREM', KEYS[5], delivery.endpoint) end
return {0, outcome, next_due}
