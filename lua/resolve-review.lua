-- resolve-review: an operator (or the review expiry) decides a `needs_review` job.
--
-- Decisions: `retry` (the operator confirmed it never executed: uncertain goes
-- back to the reservation, the job is queued with one more attempt allowed; refused while a slot is
-- kept for its prompt, `k:` in the fleet hash: the server may still run it, and only the watcher's
-- word that it ended resolves that hold, lua/slot-let-go.lua);
-- `failed` (uncertain is settled as charged, dead-letter entry); `completed`
-- (only when every output is already stored; uncertain is settled as charged).
--
-- keys: 21
-- KEYS[1] job record (hash)          KEYS[7]  job's event list
-- KEYS[2] tenant ledger (hash)       KEYS[8]  tenant's per-state counts (hash)
-- KEYS[3] tenant's review index      KEYS[9]  job's outputs (hash)
-- KEYS[4] tenant's queued (zset)     KEYS[10] tenant's done index (zset)
-- KEYS[5] tenant's outbox (zset)     KEYS[11] job's workflow (string)
-- KEYS[6] tenant's dead letters      KEYS[12] wake set (zset)
--
-- KEYS[13] global stats (hash), KEYS[14] queue (zset), KEYS[15] due (zset):
--   see use_globals in _lib.lua
-- KEYS[16] to KEYS[20] the job's parts, packed when it ends completed (`parts_at` in _lib.lua)
-- KEYS[21] fleet (hash): a slot kept for the job's prompt (`k:<job id>/<operation id>`)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] decision: retry | failed | completed
-- ARGV[3] reason
-- ARGV[4] retention (ms; '' = 0: see finalize in _lib.lua)
--
-- Returns {0 OK, new state} | {8 NOT_CLAIMABLE, state} | {10 OUTPUTS_MISSING, stored, requested}
--   | {20 PROMPT_KEPT, server} (a retry while the server may still run the prompt)

use_globals(13)
local job, now, decision = KEYS[1], clock(ARGV[1]), ARGV[2]
local f = hmget(job, 'state', 'id', 'outputs_requested', 'operation_id')
if f[1] ~= 'needs_review' then return {8, f[1] or ''} end
local job_id = f[2]
if decision == 'retry' then
  local kept = redis.call('HGET', KEYS[21], 'k:' .. job_id .. '/' .. (f[4] or ''))
  if kept then return {20, cjson.decode(kept).server} end
end
if decision == 'completed' then
  local stored = hlen(KEYS[9])
  if stored < tonumber(f[3]) then return {10, stored, tonumber(f[3])} end
end
redis.call('ZREM', KEYS[3], job_id)
if decision == 'retry' then
  resolve_hold(job, KEYS[2], 'reserved')
  hincrby(job, 'attempts_allowed', 1)
  hset(job, 'error_class', '', 'error_reason', '')
  redis.call('ZADD', KEYS[4], now, job_id)
  redis.call('ZADD', KEYS[5], now, job_id)
  wake(KEYS[12], job, now)
  move(job, KEYS[8], KEYS[7], now, 'needs_review', 'queued', ARGV[3])
  return {0, 'queued'}
end
finalize(job, {ledger = KEYS[2], done = KEYS[10], workflow = KEYS[11], wake = KEYS[12], parts = parts_at(16),
  retention = ARGV[4]}, now, decision)
if decision == 'failed' then
  redis.call('ZADD', KEYS[6], now, job_id)
  hset(job, 'error_class', 'needs_review', 'error_reason', ARGV[3])
else
  hset(job, 'error_class', '', 'error_reason', '')
end
move(job, KEYS[8], KEYS[7], now, 'needs_review', decision, ARGV[3])
return {0, decision}
