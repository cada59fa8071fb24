-- replay: an operator runs a dead-lettered (failed) job again, as the same logical job.
--
-- Guarantees: the job's full ceiling is reserved again against the tenant's
-- allowance in the same step, or nothing changes; the same idempotency record
-- keeps pointing at it; its attempts so far stay on record. A job whose workflow names uploaded
-- inputs holds each one again, as at admission (lua/admit.lua): the job goes back into each input's
-- set of jobs (a failed job may have been dropped from it) and each input's last use is now; one
-- whose input the tenant no longer has is refused, nothing written: it would be queued naming bytes
-- that may be gone.
--
-- keys: 14 or more
-- KEYS[1] job record (hash)          KEYS[5] tenant's outbox (zset)
-- KEYS[2] tenant ledger (hash)       KEYS[6] job's event list
-- KEYS[3] tenant's dead letters      KEYS[7] tenant's per-state counts (hash)
-- KEYS[4] tenant's queued (zset)     KEYS[8] tenant's done index (zset)
--                                    KEYS[9] wake set (zset)
--
-- KEYS[10] global stats (hash), KEYS[11] queue (zset), KEYS[12] due (zset):
--   see use_globals in _lib.lua
-- KEYS[13] tenant's bookings (hash), KEYS[14] tenant's booking log (zset): the failed run's charges and
--   resolved holds are logged there at the time they settled (`settled_at`), under their own ids
--   (`charge:<job>:<attempt>`, `uncertain:<job>:<attempt>`), since the job leaves the done index whose
--   score timed them in the usage records (pipeline/state/records.py); the job's `logged_through`
--   (its attempt count then) keeps them from being listed again when it ends anew
-- With inputs only, after the 14 keys: the tenant's inputs (hash: sha256 -> JSON input), the shard's inputs
-- by last use (zset: `<tenant>/<sha256>` -> ms), then one key per input: its jobs (set of job ids)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2..] with inputs only: each input's sha256, in the order of their sets' keys
--
-- Returns {0 OK} | {8 NOT_CLAIMABLE, state} | {5 INSUFFICIENT_ALLOWANCE, available, ceiling}
--   | {21 INPUT_UNKNOWN, each sha256 the tenant no longer has, ...}

use_globals(10)
local job, now = KEYS[1], clock(ARGV[1])
local f = hmget(job, 'state', 'id', 'ceiling', 'per_attempt', 'attempt_count', 'deadline_s')
if f[1] ~= 'failed' then return {8, f[1] or ''} end
local digests, past = {unpack(ARGV, 2)}, 14  -- past: the keys before the inputs' (see the header)
if #digests > 0 then
  local known, gone = redis.call('HMGET', KEYS[past + 1], unpack(digests)), {}
  for i, sha in ipairs(digests) do
    if not known[i] then gone[#gone + 1] = sha end
  end
  if #gone > 0 then return {21, unpack(gone)} end
end
local ledger = redis.call('HMGET', KEYS[2], 'allowance', 'reserved', 'settled', 'uncertain')
local available = tonumber(ledger[1]) - tonumber(ledger[2] or '0') - tonumber(ledger[3] or '0')
  - tonumber(ledger[4] or '0')
local ceiling = tonumber(f[3])
if ceiling > available then return {5, available, ceiling} end
ledger_add(KEYS[2], 'reserved', ceiling)
local s = hmget(job, 'settled_at', 'charges', 'holds', 'logged_through')
local settled_at, through = tonumber(s[1] or now), tonumber(s[4] or '0')
local function log_booking(kind, attempt, units, server, reason)
  local id = kind .. ':' .. f[2] .. ':' .. attempt
  local entry = cjson.encode({job = f[2], attempt = attempt, units = 0, kind = kind, at = settled_at,
    server = (server ~= '' and server) or cjson.null, reason = reason or cjson.null})
  redis.call('HSET', KEYS[13], id, (string.gsub(entry, '"units":0', '"units":' .. string.format('%d', units), 1)))
  redis.call('ZADD', KEYS[14], settled_at, id)
end
for entry in string.gmatch(s[2] or '', '[^,]+') do  -- '<attempt> <units> <server>' (pipeline/state/booked.py)
  local a, units, server = string.match(entry, '^(%d+) (%S+) ?(.*)$')
  if tonumber(a) > through then log_booking('charge', tonumber(a), tonumber(units), server) end
end
for entry in string.gmatch(s[3] or '', '[^,]+') do  -- '<attempt> <units> charged|released <server>'
  local a, units, outcome, server = string.match(entry, '^(%d+) (%S+) (%S+) ?(.*)$')
  if tonumber(a) > through then
    log_booking('uncertain', tonumber(a), outcome == 'charged' and tonumber(units) or 0, server, outcome)
  end
end
hset(job, 'logged_through', f[5])
hset(job, 'reserved', ceiling, 'error_class', '', 'error_reason', '',
  'attempts_allowed', tonumber(f[5]) + math.floor(ceiling / tonumber(f[4])),
  'deadline', now + 1000 * tonumber(f[6]), 'cancel_requested', 0)
hdel(job, 'settled_at')
redis.call('ZREM', KEYS[3], f[2])
redis.call('ZREM', KEYS[8], f[2])
wake(KEYS[9], job, now)
redis.call('ZADD', KEYS[4], now, f[2])
redis.call('ZADD', KEYS[5], now, f[2])
move(job, KEYS[7], KEYS[6], now, 'failed', 'queued', 'replayed')
if #digests > 0 then
  local tenant, used = hget(job, 'tenant'), {}
  for i, sha in ipairs(digests) do
    redis.call('SADD', KEYS[past + 2 + i], f[2])
    used[2 * i - 1], used[2 * i] = now, tenant .. '/' .. sha
  end
  redis.call('ZADD', KEYS[past + 2], unpack(used))
end
return {0}
