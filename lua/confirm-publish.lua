-- confirm-publish: the job's queue message is in the broker.
--
-- Guarantees: the job leaves the outbox, and its idempotency record (if it
-- still names this job and is pending) becomes `done`, so retries of the
-- request replay the first response instead of answering 409. A job the sweeper
-- published from the outbox (ARGV[3] = '1') and still queued counts as just sent, so
-- the sweeper does not redeliver it before a full window has passed without a claim
-- (the tenant's wake entry, set at admission, is earlier still); the API's publish
-- right after admission leaves the time admission gave it.
--
-- keys: 7
-- KEYS[1] tenant's outbox (zset)
-- KEYS[2] the job's idempotency record as an earlier version wrote it (string; may have expired)
-- KEYS[3] tenant's queued (zset)
-- KEYS[4] to KEYS[7] the tenant's idempotency windows around the caller's clock (`idem_windows` in _idem.lua)
--
-- ARGV[1] job id
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] '1' when the sweeper sent the message from the outbox, else ''
-- ARGV[4] the Idempotency-Key   ARGV[5] the window of KEYS[4]   ARGV[6] the idempotency TTL (s)
--
-- Returns {0 OK, 1 if this call took the job out of the outbox, else 0}: of two sweepers
-- republishing the same entry, only the one that took it publishes.

local taken = redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[3] == '1' then redis.call('ZADD', KEYS[3], 'XX', clock(ARGV[2]), ARGV[1]) end
local seen = idem_find({KEYS[4], KEYS[5], KEYS[6], KEYS[7]}, ARGV[5], math.max(1, tonumber(ARGV[6])),
  nil, ARGV[4], KEYS[2])  -- no clock read: the caller's window first
if seen and seen[2] == ARGV[1] and seen[3] == 'pending' then
  if seen[6] then  -- in its window, its expiry kept
    redis.call('HSET', seen[6], ARGV[4], idem_text('done', seen[4], seen[1], seen[2]) .. ' ' .. seen[7])
  elseif seen[5] then  -- an earlier version's record
    redis.call('HSET', KEYS[2], 'state', 'done')
  else
    redis.call('SET', KEYS[2], idem_text('done', seen[4], seen[1], seen[2]), 'KEEPTTL')
  end
end
return {0, taken}
