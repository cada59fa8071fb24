-- webhook-set: adds, replaces or removes one of a tenant's webhook endpoints, and keeps the event
-- types its endpoints ask for (the limits' `hooks`, copied into each job admitted: `hook_event` in
-- _lib.lua) in the same step. Removing an endpoint drops its deliveries with it: exhausted, due or in
-- flight (a try in flight then finds its delivery gone: its outcome changes nothing), and those waiting in
-- its jobs' lines.
--
-- A change made from an endpoint the caller read (a rotation) names that reading (ARGV[4]): if the endpoint
-- changed or went meanwhile, nothing is written and the caller reads again.
--
-- keys: 7
-- KEYS[1] tenant's endpoints (hash: id -> JSON {url, types, created_at, secrets})
-- KEYS[2] tenant's limits (hash: field `hooks`)
-- KEYS[3] the endpoint's exhausted deliveries (zset: message id -> when)
-- KEYS[4] shard's webhook deliveries (hash: `<endpoint>/<message>` -> JSON)
-- KEYS[5] the endpoint's due deliveries (zset)   KEYS[6] ready endpoints (zset)
-- KEYS[7] order (hash: `<endpoint>/<job>` -> JSON list of deliveries waiting in the job's line)
--
-- ARGV[1] endpoint id   ARGV[2] JSON endpoint; '' removes it   ARGV[3] most endpoints a tenant may have
-- ARGV[4] the endpoint's JSON as the caller read it, for a change made from it ('' for none)
--
-- Returns {0 OK} | {7 NOT_FOUND} (removing one that is not there) | {17 LIMITED} (one too many)
--   | {8 NOT_CLAIMABLE} (the endpoint is not as the caller read it)

local id, endpoint = ARGV[1], ARGV[2]
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], id) ~= ARGV[4] then return {8} end
if endpoint == '' then
  if redis.call('HDEL', KEYS[1], id) == 0 then return {7} end
  for _, message in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    redis.call('HDEL', KEYS[4], id .. '/' .. message)
  end
  for _, member in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
    local raw = redis.call('HGET', KEYS[4], member)
    if raw then
      local line = id .. '/' .. cjson.decode(raw).job
      for _, entry in ipairs(cjson.decode(redis.call('HGET', KEYS[7], line) or '[]')) do
        redis.call('HDEL', KEYS[4], (entry:gsub('^p|', '')))
      end
      redis.call('HDEL', KEYS[7], line)
      redis.call('HDEL', KEYS[4], member)
    end
  end
  redis.call('DEL', KEYS[3], KEYS[5])
  redis.call('ZREM', KEYS[6], id)
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
