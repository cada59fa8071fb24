-- review: reconciliation cannot know what happened; the job waits for an operator (fenced).
--
-- Guarantees: the job leaves every automatic path and its lease ends; its
-- uncertain units stay uncertain; it sits in the tenant's review index scored by
-- when the review expires (then the sweeper settles it as failed and charged).
-- Its dispatch slot is given back when the server no longer has the prompt (it ended, or the server
-- has no record of it); when it may still occupy the server (the server last said it was pending or
-- running, or did not answer), the slot stays taken, kept for the prompt (`keep_slot` in _slots.lua)
-- until the watcher hears it is gone: a review never lets a server run more than its cap.
--
-- keys: 12
-- KEYS[1] job record (hash)          KEYS[4] tenant's review index (zset)
-- KEYS[2] tenant's leases (zset)     KEYS[5] job's event list
-- KEYS[3] tenant's reconcile index   KEYS[6] tenant's per-state counts (hash)
--                                    KEYS[7] wake set (zset)
--                                    KEYS[8] fleet (hash)
--
-- KEYS[9] global stats (hash), KEYS[10] queue (zset), KEYS[11] due (zset):
--   see use_globals in _lib.lua
-- KEYS[12] fleet's parked jobs (zset): the caller publishes them if this freed their slot (0 if it freed none)
--
-- ARGV[1] lease generation held by the caller
-- ARGV[2] now (ms; '' = Redis's clock)
-- ARGV[3] time until the review expires (ms)
-- ARGV[4] reason
-- ARGV[5] 1: the prompt may still occupy its server, keep its slot | '' or 0: give it back
--
-- Returns {0 OK, jobs parked in the shard (0 when it gave no slot back)} | {9 STALE_LEASE}

use_globals(9)
if not holds_lease(KEYS[1], ARGV[1]) then return {9} end
local now = clock(ARGV[2])
local job_id = hget(KEYS[1], 'id')
local freed = false  -- a kept slot, or one given back when its prompt ended, frees nothing here
if ARGV[5] == '1' then keep_slot(KEYS[1], KEYS[8], now) else freed = free_slot(KEYS[1], KEYS[8]) end
release(KEYS[1], KEYS[2], job_id)
hset(KEYS[1], 'error_class', 'needs_review', 'error_reason', ARGV[4])
redis.call('ZREM', KEYS[3], job_id)
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), job_id)
wake(KEYS[7], KEYS[1], now + tonumber(ARGV[3]))
move(KEYS[1], KEYS[6], KEYS[5], now, 'reconciling', 'needs_review', ARGV[4])
return {0, freed and redis.call('ZCARD', KEYS[12]) or 0}
