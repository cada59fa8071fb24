-- finish: ends a running or reconciling job as completed, failed or cancelled,
-- and settles its cost, once.
--
-- Guarantees: only the current lease generation finishes the job, and its lease
-- ends; a job completes only with every requested output recorded; in the same
-- step the job is settled (what was charged) and the rest of its reservation
-- released. A completed run updates its class's service-time estimate. A failed job gets a dead-letter entry; a cancelled one records
-- whether a provider execution happened (external_effect). The job's dispatch
-- slot on its server is given back.
--
-- keys: 22
-- KEYS[1] job record (hash)          KEYS[7]  tenant's per-state counts (hash)
-- KEYS[2] tenant ledger (hash)       KEYS[8]  tenant's reconcile index (zset)
-- KEYS[3] tenant's leases (zset)     KEYS[9]  tenant's dead letters (zset)
-- KEYS[4] job's attempts (hash)      KEYS[10] tenant's done index (zset)
-- KEYS[5] job's event list           KEYS[11] job's workflow (string)
-- KEYS[6] job's outputs (hash)       KEYS[12] wake set (zset)
--                                    KEYS[13] fleet (hash)
--
-- KEYS[14] global stats (hash), KEYS[15] queue (zset), KEYS[16] due (zset):
--   see use_globals in _lib.lua
-- KEYS[17] fleet's parked jobs (zset): the caller publishes them if this freed their slot (0 if it freed none)
-- KEYS[18] to KEYS[22] the job's parts, packed when it ends completed or cancelled (`parts_at` in _lib.lua)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] outcome: completed | failed | cancelled
-- ARGV[4] error class ('' when completed)
-- ARGV[5] safe reason (an identifier, never provider text)
-- ARGV[6] JSON safe summary of the failure (node id, class type, error type, message), or ''
-- ARGV[7] retention (ms; '' = 0: see finalize in _lib.lua)
--
-- Returns {0 OK, outcome, jobs parked in the shard (0 when it gave no slot back)} | {9 STALE_LEASE} | {10 OUTPUTS_MISSING, stored, requested}

use_globals(14)
-- The class's service-time estimate (ms a job holds a dispatch slot, claim to completion)
-- moves a fifth of the way towards this attempt's time: an exponentially weighted average,
-- so old samples decay and a slower provider shows within a few jobs.
-- Written with the call's other stats figures (lua/_cache.lua `toward`); the attempt is read into
-- the copy end_attempt closes.
local function update_estimate(job, attempts, now)
  local raw = hget(attempts, hget(job, 'attempt_count'))
  local started = raw and cjson.decode(raw).started_at
  if not started then return end
  toward(G.stats, 'service_ms:' .. hget(job, 'priority'), now - started, 5)
end

local job, now, outcome = KEYS[1], clock(ARGV[2]), ARGV[3]
if not holds_lease(job, ARGV[1]) then return {9} end
if outcome == 'completed' then
  local stored = hlen(KEYS[6])
  local requested = tonumber(hget(job, 'outputs_requested'))
  if stored < requested then return {10, stored, requested} end
  -- cancelled while the provider worked: the outputs are kept, the job ends cancelled
  if hget(job, 'cancel_requested') == '1' then outcome = 'cancelled' end
end

local job_id = hget(job, 'id')
local from = hget(job, 'state')
if outcome == 'cancelled' then
  hset(job, 'external_effect', external_effect(job))
end
if outcome == 'completed' and from == 'running' then update_estimate(job, KEYS[4], now) end
finalize(job, {ledger = KEYS[2], done = KEYS[10], workflow = KEYS[11], wake = KEYS[12], parts = parts_at(18),
  retention = ARGV[7]}, now, outcome)
end_attempt(job, KEYS[4], now, outcome, ARGV[4])
local freed = free_slot(job, KEYS[13])
release(job, KEYS[3], job_id)
if from == 'reconciling' then redis.call('ZREM', KEYS[8], job_id) end  -- only a reconciling job is there
hset(job, 'error_class', ARGV[4], 'error_reason', ARGV[5], 'error_detail', ARGV[6])
if outcome == 'failed' then redis.call('ZADD', KEYS[9], now, job_id) end
move(job, KEYS[7], KEYS[5], now, from, outcome, ARGV[5])
return {0, outcome, freed and redis.call('ZCARD', KEYS[17]) or 0}
