-- webhook-take: leases the due deliveries of the endpoints it is given, oldest first, up to each one's
-- free places, each tenant's free places and the places in all, and counts a try; each endpoint's own
-- due set, so one endpoint's backlog never hides another's, and each tenant's share, so one tenant's
-- slow or hanging endpoints never take the places another's deliveries need. A taken delivery is due
-- again when its lease ends (the process trying it died: it is tried again, at least once); its lease
-- token fences the outcome (lua/webhook-done.lua). Its retry window starts at its first try. A delivery
-- still leased (its last try's outcome was never written: the process died, or could not write it) counts
-- that try as failed: past its window it is exhausted here (`end_delivery`, lua/_webhooks.lua), never sent
-- again each lease for ever. Then each endpoint's place in the ready set is set to its earliest due
-- delivery (or to when its circuit lets it be tried, for one given no places), or it leaves the set.
--
-- keys: 3 or more
-- KEYS[1] ready endpoints (zset: endpoint -> when its earliest delivery is due, ms)
-- KEYS[2] deliveries (hash: `<endpoint>/<message>` -> JSON)
-- KEYS[3] order (hash: `<endpoint>/<job>` -> JSON list of deliveries waiting in the job's line)
-- then for each endpoint of ARGV[9] onwards, in the same order: its due set (zset), its exhausted
-- deliveries (zset: message id -> when, ms)
--
-- ARGV[1] lease (ms)   ARGV[2] lease token prefix (unique per call)   ARGV[3] now (ms; '' = Redis's clock)
-- ARGV[4] deliveries taken at most, in all
-- ARGV[5] JSON object: tenant -> its free places, for each tenant with tries in flight
-- ARGV[6] free places of a tenant not in ARGV[5] (its share)
-- ARGV[7] retry window (ms, from a delivery's first try)   ARGV[8] exhausted deliveries kept per endpoint
-- ARGV[9] onwards: endpoint id, free places, until when it may not be tried (ms; 0: no wait) for each
--
-- Returns {0 OK, now (ms), when the earliest ready endpoint is due (ms, or -1),
--          {the tenants that had due deliveries left and no free place}, member, delivery JSON, ...}

local now, most = clock(ARGV[3]), tonumber(ARGV[4])
local room, share, full, listed = cjson.decode(ARGV[5]), tonumber(ARGV[6]), {}, {}
local out = {0, now, -1, full}
local window, kept = tonumber(ARGV[7]), tonumber(ARGV[8])
for i = 0, (#ARGV - 8) / 3 - 1 do
  local endpoint, places, closed = ARGV[9 + 3 * i], tonumber(ARGV[10 + 3 * i]), tonumber(ARGV[11 + 3 * i])
  local due = KEYS[4 + 2 * i]
  local k = {due = due, deliveries = KEYS[2], order = KEYS[3], exhausted = KEYS[5 + 2 * i], ready = KEYS[1]}
  if places > 0 and most > 0 then
    for j, member in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, math.min(places, most))) do
      local raw = redis.call('HGET', KEYS[2], member)
      if not raw then
        redis.call('ZREM', due, member)  -- its endpoint was removed
      else
        local delivery = cjson.decode(raw)
        local free = room[delivery.tenant] or share
        if delivery.lease and now > delivery.first_at + window then  -- its last try, never recorded, was its last
          delivery.last_at, delivery.last_error = now, 'outcome not recorded (its lease ended)'
          end_delivery(k, member, delivery, true, now, kept)
        elseif free <= 0 then  -- the tenant's share is in flight: the endpoint waits (every delivery is its tenant's)
          if not listed[delivery.tenant] then
            listed[delivery.tenant] = true
            full[#full + 1] = delivery.tenant
          end
          break
        else
          room[delivery.tenant], most = free - 1, most - 1
          delivery.attempts = delivery.attempts + 1
          if delivery.attempts == 1 then delivery.first_at = now end
          delivery.lease = ARGV[2] .. ':' .. i .. ':' .. j
          raw = cjson.encode(delivery)
          redis.call('HSET', KEYS[2], member, raw)
          redis.call('ZADD', due, now + tonumber(ARGV[1]), member)
          out[#out + 1] = member
          out[#out + 1] = raw
        end
      end
    end
  end
  local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  if not first[2] then
    redis.call('ZREM', KEYS[1], endpoint)
  else
    redis.call('ZADD', KEYS[1], math.max(tonumber(first[2]), closed), endpoint)
  end
end
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if earliest[2] then out[3] = tonumber(earliest[2]) end
return out
