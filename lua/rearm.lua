-- rearm: after a sweeper's visit, the tenant's wake entry becomes the true time its
-- next work is due (or the tenant leaves the wake set when it has none).
--
-- Every script that schedules work moves the entry earlier in the same step, so
-- reading the indexes and writing the entry here, atomically, loses nothing.
--
-- keys: 8
-- KEYS[1] wake set (zset: tenant -> when work is due)
-- KEYS[2] tenant's leases (zset: by expiry)       KEYS[6] tenant's review (zset: by expiry)
-- KEYS[3] tenant's reconcile (zset: by due time)  KEYS[7] tenant's outbox (zset: by due time)
-- KEYS[4] tenant's queued (zset: since when)      KEYS[8] tenant's done (zset: since when)
-- KEYS[5] tenant's retry (zset: by due time)
--
-- ARGV[1] tenant
-- ARGV[2] redelivery window (ms): a queued job is due this long after its score
-- ARGV[3] retention (ms): a finished job is due for purging this long after its score
--
-- Returns {0 OK, next due (ms) or -1 when nothing is scheduled}

local due = nil
local function earliest(key, offset)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    local at = tonumber(first[2]) + offset
    if due == nil or at < due then due = at end
  end
end
earliest(KEYS[2], 0)
earliest(KEYS[3], 0)
earliest(KEYS[4], tonumber(ARGV[2]))
earliest(KEYS[5], 0)
earliest(KEYS[6], 0)
earliest(KEYS[7], 0)
earliest(KEYS[8], tonumber(ARGV[3]))
if due == nil then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {0, -1}
end
redis.call('ZADD', KEYS[1], due, ARGV[1])
return {0, due}
