-- Shared helpers, prepended to every script by pipeline/scripts.py.
-- They only touch keys their caller passes in; the caller's KEYS hold all of them.

-- Appends one state-change event to the job's event list (seq counts from 1).
local function append_event(job, events, now, from, to, reason)
  local seq = redis.call('HINCRBY', job, 'event_seq', 1)
  redis.call('RPUSH', events, cjson.encode({
    seq = seq, at = tonumber(now), from = (from ~= '' and from) or cjson.null, to = to, reason = reason}))
end

-- Moves a job from one state to another: record, per-state counts, event log.
local function move(job, counts, events, now, from, to, reason)
  redis.call('HSET', job, 'state', to, 'updated_at', now)
  if from ~= '' then redis.call('HINCRBY', counts, from, -1) end
  redis.call('HINCRBY', counts, to, 1)
  append_event(job, events, now, from, to, reason)
end

-- True when the job is running under lease generation `gen` (a string).
local function holds_lease(job, gen)
  local f = redis.call('HMGET', job, 'state', 'lease_gen')
  return f[1] == 'running' and f[2] == gen
end

-- Closes the job's current attempt record with a final state.
local function end_attempt(job, attempts, now, state, error_class)
  local n = redis.call('HGET', job, 'attempt_count')
  local raw = redis.call('HGET', attempts, n)
  if not raw then return end
  local attempt = cjson.decode(raw)
  attempt.state = state
  attempt.ended_at = tonumber(now)
  attempt.error_class = (error_class ~= '' and error_class) or cjson.null
  redis.call('HSET', attempts, n, cjson.encode(attempt))
end

-- Settles the job once: its whole reservation leaves the tenant's `reserved`,
-- `cost` is booked as settled. A job already settled is left alone (returns 0).
local function settle(job, ledger, now, cost)
  if redis.call('HEXISTS', job, 'settled_at') == 1 then return 0 end
  local reserved = tonumber(redis.call('HGET', job, 'reserved') or '0')
  redis.call('HINCRBY', ledger, 'reserved', -reserved)
  redis.call('HINCRBY', ledger, 'settled', cost)
  redis.call('HSET', job, 'reserved', 0, 'settled', cost, 'settled_at', now)
  return 1
end
