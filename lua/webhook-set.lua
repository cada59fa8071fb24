-- webhook-set: adds, replaces or removes one of a tenant's webhook endpoints, and keeps the event
-- types its endpoints ask for (the limits' `hooks`, copied into each job admitted: `hook_event` in
-- _lib.lua) in the same step. Removing an endpoint drops its exhausted deliveries with it; its
-- pending ones are dropped when they are next taken (pipeline/webhooks/sender.py).
--
-- keys: 4
-- KEYS[1] tenant's endpoints (hash: id -> JSON {url, types, created_at, secrets})
-- KEYS[2] tenant's limits (hash: field `hooks`)
-- KEYS[3] the endpoint's exhausted deliveries (zset: message id -> when)
-- KEYS[4] shard's webhook deliveries (hash: `<endpoint>/<message>` -> JSON)
--
-- ARGV[1] endpoint id   ARGV[2] JSON endpoint; '' removes it   ARGV[3] most endpoints a tenant may have
--
-- Returns {0 OK} | {7 NOT_FOUND} (removing one that is not there) | {17 LIMITED} (one too many)

local id, endpoint = ARGV[1], ARGV[2]
if endpoint == '' then
  if redis.call('HDEL', KEYS[1], id) == 0 then return {7} end
  for _, message in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    redis.call('HDEL', KEYS[4], id .. '/' .. message)
  end
  redis.call('DEL', KEYS[3])
else
  if redis.call('HEXISTS', KEYS[1], id) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
    return {17}
  end
  redis.call('HSET', KEYS[1], id, endpoint)
end
local wanted, types = {}, {}
for _, raw in ipairs(redis.call('HVALS', KEYS[1])) do
  for _, type in ipairs(cjson.decode(raw).types) do
    if not wanted[type] then
      wanted[type] = true
      types[#types + 1] = type
    end
  end
end
table.sort(types)
if #types == 0 then
  redis.call('HDEL', KEYS[2], 'hooks')
else
  redis.call('HSET', KEYS[2], 'hooks', ',' .. table.concat(types, ',') .. ',')
end
return {0}
