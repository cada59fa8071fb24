-- unpark: calls as many parked jobs as the fleet has slots free and not yet promised,
-- for the caller to publish again (best priority, then the fairest: lowest finish tag, first).
--
-- Guarantees: a called job is promised a slot until it claims (or `call` ms pass: its
-- message was lost), so unparks that run before it arrives call nobody else for the
-- same slot: no job is published without a slot for it, and a full fleet is not
-- polled. A called job stays in the parked set, in its place, until it claims: if its
-- call lapses, a later unpark calls it again first.
--
-- No starvation: a batch job queued longer than the bound (ARGV[3]) is served before any
-- interactive job. Each unpark moves up to AGED of the oldest such parked jobs ahead of every
-- other (score: when it was queued, less 1e13; so among them the oldest goes first), found in
-- O(log n) in the shard's queue (scored by class and time queued). A batch job still in the
-- broker's queue, not parked, is not moved: its claim comes first anyway.
--
-- keys: 4
-- KEYS[1] fleet (hash)
-- KEYS[2] fleet's parked jobs (zset; score: 1e13 for batch, plus the job's finish tag; or, for
--         a batch job past the bound, when it was queued less 1e13)
-- KEYS[3] fleet's called jobs (zset; score: when the promise lapses, ms)
-- KEYS[4] queue (zset: see use_globals in _lib.lua)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] how long a call holds its slot (ms)
-- ARGV[3] longest a batch job waits behind interactive ones (ms)
-- ARGV[4], ARGV[5], ... server name, its cap, for each server
--
-- Jobs of a paused class (`pause_class:<class>` in the fleet hash) are not called; a batch job
-- past the bound is a batch job for its class's pause.
--
-- Returns {0 OK, job id, score, job id, score, ...}. The caller publishes them to the
-- `reckon-unparked` queue, which workers serve before their other queues, so a parked
-- job does not wait again behind the backlog that arrived after it.

-- Parked jobs looked at beyond the free slots, for jobs passed over because no server of theirs is free.
local LOOKAHEAD = 32

if redis.call('ZCARD', KEYS[2]) == 0 then return {0} end
local now = clock(ARGV[1])
local servers = {}
for i = 4, #ARGV, 2 do servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])} end
fleet_view(KEYS[1], servers)
local interactive_paused = paused_for(KEYS[1], 'interactive')
local batch_paused = paused_for(KEYS[1], 'batch')
if not batch_paused then age_batch(KEYS[2], KEYS[4], now, tonumber(ARGV[3])) end
local calls = promised(KEYS[3], KEYS[2], now)
local open = free_slots(KEYS[1], servers) - #calls
local reply = {0}
if open <= 0 or (interactive_paused and batch_paused) then return reply end
local best
local want = open + #calls + LOOKAHEAD
if batch_paused then  -- interactive ones only
  best = redis.call('ZRANGEBYSCORE', KEYS[2], 0, '(' .. BATCH_RANK, 'WITHSCORES', 'LIMIT', 0, want)
elseif interactive_paused then  -- batch ones, past the bound first
  best = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(0', 'WITHSCORES', 'LIMIT', 0, want)
  for _, item in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], BATCH_RANK, '+inf', 'WITHSCORES', 'LIMIT', 0,
      want - #best / 2)) do best[#best + 1] = item end
else
  best = redis.call('ZRANGE', KEYS[2], 0, want - 1, 'WITHSCORES')
end
-- Each call is matched to a free slot of a server that can run the job (`match_calls`: a job none of
-- whose servers has a slot free is passed over, not called, so it holds no slot another server could
-- fill), with checkpoint affinity among batch jobs.
for _, at in ipairs(match_calls(KEYS[1], servers, best, KEYS[3], open)) do
  reply[#reply + 1], reply[#reply + 2] = best[at], best[at + 1]
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), best[at])
end
return reply
