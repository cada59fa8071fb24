-- take-due: a sweeper takes the tenants whose work is due, for one pass.
--
-- Guarantees: each due tenant is handed to one sweeper at a time: its wake entry
-- moves `hold` into the future, so a second sweeper running at once takes other
-- tenants (or none); the visit ends with `rearm`. If the sweeper dies mid-pass,
-- the tenant comes due again when the hold runs out.
--
-- keys: 1
-- KEYS[1] wake set (zset: tenant -> when work is due)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] most tenants to take
-- ARGV[3] hold (ms)
--
-- Returns {0 OK, now (ms: the clock the holds and the visits go by), tenant, ...}

local now = clock(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local reply = {0, now}
for _, tenant in ipairs(due) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), tenant)
  reply[#reply + 1] = tenant
end
return reply
