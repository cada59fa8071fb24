-- cancel: the client no longer wants the job.
--
-- Guarantees: a queued or retry_wait job is cancelled at once and settled (its
-- unused reservation released). A needs_review job is cancelled at once too: no
-- operator decision can run it again, and what is still uncertain is settled as
-- charged (the release policy: releasing it would understate what may be owed).
-- A running or reconciling job gets a cancel request: no new provider submission
-- starts after it (mark-submit checks it), and the job ends cancelled once its
-- outcome is known. Cancelling again changes nothing. `external_effect` says
-- whether a provider execution may already have happened: none, possible or occurred.
-- A cancelled job leaves the fleet's parked set, so no free slot is spent on it. A job at its
-- server's watcher has the request marked on its watch entry too (`cancel`), so the watcher
-- learns of it from the watch list it reads anyway, with no read of each job's record.
--
-- keys: 20
-- KEYS[1] job record (hash)          KEYS[6]  tenant's per-state counts (hash)
-- KEYS[2] tenant ledger (hash)       KEYS[7]  tenant's review index (zset)
-- KEYS[3] tenant's queued (zset)     KEYS[8]  tenant's done index (zset)
-- KEYS[4] tenant's retry index       KEYS[9]  job's workflow (string)
-- KEYS[5] job's event list           KEYS[10] wake set (zset)
--                                    KEYS[11] fleet's parked jobs (zset)
--
-- KEYS[12] global stats (hash), KEYS[13] queue (zset), KEYS[14] due (zset):
--   see use_globals in _lib.lua
-- KEYS[15] to KEYS[19] the job's parts, packed when it ends (`parts_at` in _lib.lua)
-- KEYS[20] fleet (hash: the watch list)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] retention (ms; '' = 0: see finalize in _lib.lua)
--
-- Returns {0 OK, state, external_effect} | {7 NOT_FOUND}

use_globals(12)
local job, now = KEYS[1], clock(ARGV[1])
local f = hmget(job, 'state', 'id')
if not f[1] then return {7} end
local state = f[1]
local effect = external_effect(job)
if state == 'queued' or state == 'retry_wait' or state == 'needs_review' then
  redis.call('ZREM', KEYS[7], f[2])
  if redis.call('ZREM', KEYS[11], f[2]) == 1 then  -- parked: its placement and promised server go (_slots.lua)
    redis.call('HDEL', KEYS[20], 'p:' .. f[2], 'c:' .. f[2])
  end
  hset(job, 'cancel_requested', 1, 'external_effect', effect)
  end_waiting(job, {ledger = KEYS[2], queued = KEYS[3], retry = KEYS[4], events = KEYS[5], counts = KEYS[6],
    done = KEYS[8], workflow = KEYS[9], wake = KEYS[10], parts = parts_at(15), retention = ARGV[2]}, now, state, 'cancelled', 'cancelled')
  return {0, 'cancelled', effect}
end
if state == 'running' or state == 'reconciling' then
  if hget(job, 'cancel_requested') ~= '1' then
    hset(job, 'cancel_requested', 1, 'external_effect', effect)
    append_event(job, KEYS[5], now, state, state, 'cancel_requested')
    local watched = hget(job, 'lease_owner') == 'watcher' and redis.call('HGET', KEYS[20], 'w:' .. f[2])
    if watched then
      local entry = cjson.decode(watched)
      entry.cancel = 1
      redis.call('HSET', KEYS[20], 'w:' .. f[2], cjson.encode(entry))
    end
  end
  return {0, state, effect}
end
return {0, state, hget(job, 'external_effect') or effect}
