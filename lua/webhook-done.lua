-- webhook-done: records the outcome of one try of a delivery under its lease: delivered or dropped (its
-- endpoint is gone) removes it; a failure makes it due again after the caller's delay, unless that is
-- past its retry window (from its first try), when it is exhausted: kept, listed and redelivered on
-- request. Either way the job's next delivery to that endpoint, if one waits, becomes due (`end_delivery`
-- in lua/_webhooks.lua). A lease that is not the delivery's (it lapsed and another try took it) changes
-- nothing.
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
local k = {due = KEYS[1], deliveries = KEYS[2], order = KEYS[3], exhausted = KEYS[4], ready = KEYS[5]}
return {0, outcome, end_delivery(k, member, delivery, outcome == 'exhausted', now, tonumber(ARGV[7]))}
