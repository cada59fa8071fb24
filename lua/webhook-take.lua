-- webhook-take: leases the deliveries due now, oldest first, within each endpoint's free places: a
-- taken one is due again when its lease ends (the process trying it died: it is tried again, at least
-- once), and counts a try. Its lease token fences the outcome (lua/webhook-done.lua).
--
-- keys: 2
-- KEYS[1] due deliveries (zset: `<endpoint>/<message>` -> when, ms)
-- KEYS[2] deliveries (hash: `<endpoint>/<message>` -> JSON)
--
-- ARGV[1] lease (ms)   ARGV[2] most to take   ARGV[3] most due entries to look at
-- ARGV[4] JSON {endpoint: free places} for endpoints with fewer than ARGV[5] (0: its circuit is open)
-- ARGV[5] free places of any other endpoint   ARGV[6] lease token prefix (unique per call)
--
-- Returns {0 OK, now (ms), when the next due one is due (ms, or -1), member, delivery JSON, ...}

local now = clock('')
local free, default = cjson.decode(ARGV[4]), tonumber(ARGV[5])
local out, taken = {0, now, -1}, 0
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for i, member in ipairs(due) do
  if taken >= tonumber(ARGV[2]) then break end
  local endpoint = string.match(member, '^([^/]*)/')
  local places = free[endpoint] or default
  if places > 0 then
    local raw = redis.call('HGET', KEYS[2], member)
    if not raw then
      redis.call('ZREM', KEYS[1], member)  -- its endpoint was removed
    else
      local delivery = cjson.decode(raw)
      delivery.attempts = delivery.attempts + 1
      delivery.lease = ARGV[6] .. ':' .. i
      raw = cjson.encode(delivery)
      redis.call('HSET', KEYS[2], member, raw)
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), member)
      free[endpoint] = places - 1
      taken = taken + 1
      out[#out + 1] = member
      out[#out + 1] = raw
    end
  end
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if next_due[2] then out[3] = tonumber(next_due[2]) end
return out
