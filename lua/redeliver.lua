-- redeliver: a job whose queue message may be lost is sent again (sweeper).
--
-- A message can vanish without an error reaching reckon: a worker killed while
-- holding prefetched messages, a message failed before its claim. So a job that
-- waits in `queued` (or `reconciling`) past its window without being claimed is
-- published again; duplicates are harmless (a claim takes the job once). Each
-- redelivery of the same wait doubles the window (up to 32x), so a long backlog
-- is not flooded with copies; a claim resets it. A job parked for a slot is not sent again (it has no
-- message to lose: a freed slot calls it); it is looked at again 32 windows later. A queued job past its deadline
-- fails `deadline_exceeded` here instead, settled, never dispatched, and leaves the fleet's parked
-- and called sets with its fields there (`p:` and `c:`: _slots.lua), as a claim would.
--
-- keys: 15
-- KEYS[1] job record (hash)          KEYS[5] job's event list
-- KEYS[2] index the job waits in     KEYS[6] tenant's per-state counts (hash)
--         (queued or reconcile zset) KEYS[7] tenant's done index (zset)
-- KEYS[3] tenant ledger (hash)       KEYS[8] job's workflow (string)
-- KEYS[4] tenant's dead letters      KEYS[9] wake set (zset)
--
-- KEYS[10] global stats (hash), KEYS[11] queue (zset), KEYS[12] due (zset):
--   see use_globals in _lib.lua
-- KEYS[13] fleet (hash)   KEYS[14] fleet's parked jobs (zset)   KEYS[15] fleet's called jobs (zset)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] job id
-- ARGV[3] state the index holds: queued | reconciling
-- ARGV[4] redelivery window (ms)
-- ARGV[5] retention (ms; '' = 0: see finalize in _lib.lua)
--
-- Returns {0 OK, sends so far, priority} (publish now) | {14 EXPIRED} | {11 NOT_DUE}
--   | {7 NOT_FOUND} (index cleaned)

local PARKED_WINDOWS = 32
use_globals(10)
local job, now, job_id, state = KEYS[1], clock(ARGV[1]), ARGV[2], ARGV[3]
local f = hmget(job, 'state', 'deadline', 'priority')
if f[1] ~= state then
  redis.call('ZREM', KEYS[2], job_id)
  return {7}
end
-- queued is scored by when the wait began (due after one window), reconcile by when it is due
local score = tonumber(redis.call('ZSCORE', KEYS[2], job_id) or now)
if state == 'queued' then score = score + tonumber(ARGV[4]) end
if score > now then return {11} end
if state == 'queued' and tonumber(f[2]) <= now then
  leave_parked(KEYS[13], KEYS[14], KEYS[15], job_id)
  expire_queued(job, {ledger = KEYS[3], queued = KEYS[2], dead = KEYS[4], events = KEYS[5], counts = KEYS[6],
    done = KEYS[7], workflow = KEYS[8], wake = KEYS[9], retention = ARGV[5]}, now, 'deadline_passed_while_queued')
  return {14}
end
-- Parked for a slot, it has no message to lose: a freed slot's unpark (or the sweeper's pass) calls it,
-- and a lost call lapses and is made again. Sending it again would only park it again (a claim, a
-- broker message, a fetch: Redis CPU a backlog paid for each parked job, each window). Asked again
-- once PARKED_WINDOWS windows passed.
if state == 'queued' and redis.call('ZSCORE', KEYS[14], job_id) then
  redis.call('ZADD', KEYS[2], now + (PARKED_WINDOWS - 1) * tonumber(ARGV[4]), job_id)
  wake(KEYS[9], job, now + PARKED_WINDOWS * tonumber(ARGV[4]))
  return {11}
end
local sends = hincrby(job, 'sends', 1)
local window = tonumber(ARGV[4]) * 2 ^ math.min(sends - 1, 5)
if state == 'queued' then window = window * 2 - tonumber(ARGV[4]) end
redis.call('ZADD', KEYS[2], now + window, job_id)
wake(KEYS[9], job, now + tonumber(ARGV[4]))
return {0, sends, f[3]}
