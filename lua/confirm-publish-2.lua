-- confirm-publish: the job's queue message is in the broker.
--
-- Guarantees: the job leaves the outbox, and its idempotency record (if it
-- still names this job and is pending) becomes `done`, so retries of the
-- request replay the first response instead of answering 409.
--
-- KEYS[1] tenant's outbox (zset)
-- KEYS[2] the job's idempotency record (hash; may have expired)
--
-- ARGV[1] job id
--
-- Returns {0 OK}

redis.call('ZREM', KEYS[1], ARGV[1])
local seen = redis.call('HMGET', KEYS[2], 'job_id', 'state')
if seen[1] == ARGV[1] and seen[2] == 'pending' then
  redis.call('HSET', KEYS[2], 'state', 'done')
end
return {0}
