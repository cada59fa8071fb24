-- defer: a queued job is not dispatched now (its provider is marked unusable) and
-- waits in retry_wait for `delay`. No attempt is opened, none is counted.
--
-- KEYS[1] job record (hash)          KEYS[4] job's event list
-- KEYS[2] tenant's queued (zset)     KEYS[5] tenant's per-state counts (hash)
-- KEYS[3] tenant's retry index      KEYS[6] wake set (zset)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] delay (ms)
-- ARGV[3] reason
--
-- Returns {0 OK} | {8 NOT_CLAIMABLE, state}

local job, now = KEYS[1], clock(ARGV[1])
local due = now + tonumber(ARGV[2])
local f = redis.call('HMGET', job, 'state', 'id')
if f[1] ~= 'queued' then return {8, f[1] or ''} end
redis.call('ZREM', KEYS[2], f[2])
redis.call('ZADD', KEYS[3], due, f[2])
wake(KEYS[6], job, due)
redis.call('HSET', job, 'retry_at', due)
move(job, KEYS[5], KEYS[4], now, 'queued', 'retry_wait', ARGV[3])
return {0}
