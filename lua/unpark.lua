-- unpark: calls as many parked jobs as the fleet has slots free and not yet promised,
-- for the caller to publish again (best priority, then the fairest: lowest finish tag, first).
--
-- Guarantees: a called job is promised a slot until it claims (or `call` ms pass: its
-- message was lost), so unparks that run before it arrives call nobody else for the
-- same slot: no job is published without a slot for it, and a full fleet is not
-- polled. Only the calls promised a slot of ARGV's servers hold one of them (`calls_held`): an
-- unpark of one server's slot is not held back by a call to another server not yet claimed.
-- A called job stays in the parked set, in its place, until it claims: if its
-- call lapses, a later unpark calls it again first.
--
-- No starvation: while a batch job queued longer than the bound (ARGV[3]) waits parked and a usable
-- server (not stopped) can run it, batch is served before interactive, in fair order among its tenants:
-- each unpark moves the batch jobs of lowest tag that a usable server can run ahead of every other, up
-- to AGED moved at a time (`age_batch` in _slots.lua; score: the tag less 1e13), so a small tenant's job
-- is not behind a big tenant's aged backlog. A moved job whose servers have all stopped goes back to its
-- tag, so jobs that cannot run hold no moved place and move nothing. The jobs past the bound are found in
-- O(log n) in the shard's queue (scored by class and time queued). A batch job still in the broker's
-- queue, not parked, moves nothing until its claim parks it.
--
-- keys: 5 or more
-- KEYS[1] fleet (hash)
-- KEYS[2] fleet's parked jobs (zset; score: 1e13 for batch, plus the job's finish tag; or, for
--         a batch job moved past the bound, its tag less 1e13)
-- KEYS[3] fleet's called jobs (zset; score: when the promise lapses, ms)
-- KEYS[4] queue (zset: see use_globals in _lib.lua)
-- KEYS[5] fleet's parked jobs any server can run (zset), then, for each server of ARGV[4] onwards in the
--         same order, the parked jobs only some servers can run, that one among them (lua/_waiting.lua)
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] how long a call holds its slot (ms)
-- ARGV[3] longest a batch job waits behind interactive ones (ms)
-- ARGV[4], ARGV[5], ARGV[6], ... for each server: its name, its cap, and its slots free across shards
--   ('' with one shard: pipeline/state/slots.py), which bounds its free slots here
--
-- Jobs of a paused class (`pause_class:<class>` in the fleet hash) are not called; a batch job
-- past the bound is a batch job for its class's pause.
--
-- Returns {0 OK, jobs parked in the shard, job id, its promised server, job id, its promised server, ...}.
-- The caller publishes them to the `reckon-unparked` queue, which workers serve before their other
-- queues, so a parked job does not wait again behind the backlog that arrived after it; with shards
-- it first reserves each one's slot on its server's key (pipeline/state/calls.py).

-- Parked jobs read from the head of the parked set beyond the free slots.
local LOOKAHEAD = 32

local parked = redis.call('ZCARD', KEYS[2])
if parked == 0 then return {0, 0} end
local now = clock(ARGV[1])
local indexes = parked_indexes(5, 4, 3)
local servers = {}
local across = {}
for i = 4, #ARGV, 3 do
  servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])}
  across[ARGV[i]] = tonumber(ARGV[i + 2])
end
fleet_view(KEYS[1], servers)
for _, server in ipairs(servers) do  -- with shards, no more free here than across all of them
  local busy = across[server[1]] and server_busy(KEYS[1], server[1])
  if busy then server[2] = math.min(server[2], busy + across[server[1]]) end
end
local interactive_paused = paused_for(KEYS[1], 'interactive')
local batch_paused = paused_for(KEYS[1], 'batch')
if not batch_paused then  -- a job moved or sent back keeps its score in its indexes too
  reindex_parked(KEYS[1], indexes, age_batch(KEYS[1], servers, KEYS[2], KEYS[4], now, tonumber(ARGV[3])))
end
local calls = promised(KEYS[3], KEYS[2], now)
local open = free_slots(KEYS[1], servers) - calls_held(KEYS[1], servers, calls)
local reply = {0, parked}
if open <= 0 or (interactive_paused and batch_paused) then return reply end
-- The parked jobs in dispatch order from `offset` on (`count` of them), less those of a paused class.
local moved = interactive_paused and redis.call('ZCOUNT', KEYS[2], '-inf', '(0') or 0
local function page(offset, count)
  if batch_paused then  -- interactive ones only
    return redis.call('ZRANGEBYSCORE', KEYS[2], 0, '(' .. BATCH_RANK, 'WITHSCORES', 'LIMIT', offset, count)
  elseif interactive_paused then  -- batch ones, past the bound first
    local found = {}
    if offset < moved then
      found = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(0', 'WITHSCORES', 'LIMIT', offset, count)
    end
    if #found / 2 < count then
      for _, item in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], BATCH_RANK, '+inf', 'WITHSCORES', 'LIMIT',
          math.max(0, offset - moved), count - #found / 2)) do found[#found + 1] = item end
    end
    return found
  end
  return redis.call('ZRANGE', KEYS[2], offset, offset + count - 1, 'WITHSCORES')
end
-- The head of the parked set (jobs moved past the bound first, then by class and tag) and, for each
-- server with a slot free, the best jobs it can run from the indexes (lua/_waiting.lua): a job that a
-- free server can run is found however many parked jobs of full servers rank above it.
local best = page(0, open + #calls + LOOKAHEAD)
local lo, hi = '-inf', '+inf'
if batch_paused then lo, hi = 0, '(' .. BATCH_RANK elseif interactive_paused then lo = BATCH_RANK end
local more = index_head(KEYS[2], indexes[''], open + #calls + AFFINITY_WINDOW, lo, hi)
for _, server in ipairs(servers) do
  local busy = server_busy(KEYS[1], server[1])
  if busy and busy < server[2] and indexes[server[1]] then
    local count = server[2] - busy + #calls + AFFINITY_WINDOW
    for _, item in ipairs(index_head(KEYS[2], indexes[server[1]], count, lo, hi)) do more[#more + 1] = item end
  end
end
best = merge_ranked(best, more)
-- Each call is matched to a free slot of a server that can run the job (`match_calls`: a job none of
-- whose servers has a slot free is passed over, not called, so it holds no slot another server could
-- fill), with checkpoint affinity among batch jobs.
for _, at in ipairs(match_calls(KEYS[1], servers, best, calls, open)) do
  reply[#reply + 1], reply[#reply + 2] = best[at], hget(KEYS[1], 'c:' .. best[at])
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), best[at])
end
return reply
