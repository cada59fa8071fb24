-- cancel: the client no longer wants the job.
--
-- Guarantees: a queued or retry_wait job is cancelled at once and settled (its
-- unused reservation released); a running or reconciling job gets a cancel
-- request, and no new provider submission starts after it (mark-submit checks
-- it); cancelling again changes nothing. With reason `superseded` (a newer job
-- replaces this one) a running job is only marked obsolete, not stopped. `external_effect` says whether a
-- provider execution may already have happened: none, possible or occurred.
--
-- KEYS[1] job record (hash)          KEYS[5] tenant's outbox (zset)
-- KEYS[2] tenant ledger (hash)       KEYS[6] job's event list
-- KEYS[3] tenant's queued (zset)     KEYS[7] tenant's per-state counts (hash)
-- KEYS[4] tenant's retry index
--
-- ARGV[1] now (ms)
-- ARGV[2] reason (cancelled | superseded)
--
-- Returns {0 OK, state, external_effect} | {7 NOT_FOUND}

local job, now = KEYS[1], ARGV[1]
local f = redis.call('HMGET', job, 'state', 'id', 'submitted', 'settled', 'attempt_count')
if not f[1] then return {7} end
local state = f[1]
local effect = 'none'
if f[3] == '1' then effect = 'possible' end
if state == 'queued' or state == 'retry_wait' then
  -- an earlier attempt that was charged is an execution that occurred
  if tonumber(redis.call('HGET', job, 'charged') or '0') > 0 then effect = 'occurred' end
  redis.call('ZREM', KEYS[3], f[2])
  redis.call('ZREM', KEYS[4], f[2])
  redis.call('ZREM', KEYS[5], f[2])
  settle(job, KEYS[2], now)
  redis.call('HSET', job, 'cancel_requested', 1, 'external_effect', effect)
  move(job, KEYS[7], KEYS[6], now, state, 'cancelled', ARGV[2])
  return {0, 'cancelled', effect}
end
if state == 'running' or state == 'reconciling' then
  if ARGV[2] == 'superseded' then
    -- already dispatched: it runs on, only marked obsolete for delivery
    redis.call('HSET', job, 'obsolete', 1)
    return {0, state, effect}
  end
  if redis.call('HGET', job, 'cancel_requested') ~= '1' then
    redis.call('HSET', job, 'cancel_requested', 1, 'external_effect', effect)
    append_event(job, KEYS[6], now, state, state, 'cancel_requested')
  end
  return {0, state, effect}
end
return {0, state, redis.call('HGET', job, 'external_effect') or (tonumber(f[4]) > 0 and 'occurred' or 'none')}
