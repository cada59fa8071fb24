-- budget: a provider's shared retry budget, a token bucket (as AWS SDKs keep one).
--
-- Guarantees: a retry is allowed only when `cost` tokens can be taken; a success
-- refunds `cost` tokens (capped at capacity). All callers share one bucket.
--
-- keys: 1
-- KEYS[1] provider's retry budget (hash: tokens)
--
-- ARGV[1] operation: take | refund
-- ARGV[2] tokens (a take's cost, or a refund's amount)
-- ARGV[3] capacity (the bucket starts full)
--
-- Returns {0 OK, tokens left} | {13 BUDGET_EXHAUSTED, tokens left}

local capacity = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or capacity)
local amount = tonumber(ARGV[2])
if ARGV[1] == 'take' then
  if tokens < amount then return {13, tokens} end
  tokens = tokens - amount
else
  tokens = math.min(capacity, tokens + amount)
end
redis.call('HSET', KEYS[1], 'tokens', tokens)
return {0, tokens}
