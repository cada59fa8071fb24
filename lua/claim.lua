-- claim: a worker takes a queued job under a fenced lease and opens an attempt.
--
-- Guarantees: only a `queued` job is claimed; each claim raises the job's
-- lease generation by one, and every later write by the worker must present
-- that generation. The lease expiry is on Redis's clock, so a worker whose
-- clock is off can neither shorten nor lengthen it. The attempt record, with
-- the provider operation id chosen by the caller, exists before the provider
-- is ever called. A job with too little time left before its deadline is not
-- run: it fails `deadline_exceeded`, settled, its reservation released.
--
-- Dispatch: in the same step the claim takes a slot on one server of the fleet,
-- the least loaded of those the caller can reach (then round-robin), skipping a
-- server that is paused, unreachable or refusing our credentials, or at its cap.
-- So a server's cap holds however many workers claim at once. With no server
-- free, the job stays `queued`, parked in the fleet's waiting set (by priority,
-- then finish tag: fair between tenants by cost, see _slots.lua; batch jobs moved ahead by the
-- starvation bound go first, see `age_batch`) without using an attempt; a freed slot publishes
-- it again. A job does
-- not take a slot that better-ranked parked jobs are waiting for (as many slots as
-- are free go to the best parked, and slots promised to called jobs are theirs), so a
-- parked job is not overtaken by newcomers.
-- A claim that takes a slot adds the job's cost (its reserved price times its outputs) to
-- `served:<class>:<tenant>` in the fleet hash: the fair-share figures (pipeline/state/fairness.py).
-- The claim records the price per output of the server it took (`attempt_price` on the job,
-- `price` on the attempt): what an unknown outcome of this attempt holds as uncertain.
-- A claim hands back what the attempt needs (the workflow, the outputs still to make), read in
-- the same step, before the submission is marked.
-- A parked job is indexed by the servers it can run on (lua/_waiting.lua), so the parked jobs counted ahead
-- of a claim are those that could take a free slot of one of its own servers: another server's backlog
-- does not hold this job from a slot it could use.
--
-- keys: 19 or more
-- KEYS[1] job record (hash)          KEYS[7]  tenant ledger (hash)
-- KEYS[2] tenant's leases (zset)     KEYS[8]  tenant's dead letters (zset)
-- KEYS[3] tenant's queued (zset)     KEYS[9]  tenant's done index (zset)
-- KEYS[4] job's attempts (hash)      KEYS[10] job's workflow (string)
-- KEYS[5] job's event list           KEYS[11] wake set (zset)
-- KEYS[6] tenant's per-state counts (hash)   KEYS[12] fleet (hash)
--                                           KEYS[13] fleet's parked jobs (zset; score: 1e13 for batch, plus
--                                                    the job's finish tag: `finish_tag` in _slots.lua;
--                                                    below 0: a batch job moved ahead, `age_batch`)
--                                           KEYS[14] fleet's called jobs (zset)
--
-- KEYS[15] global stats (hash), KEYS[16] queue (zset), KEYS[17] due (zset):
--   see use_globals in _lib.lua
-- KEYS[18] job's outputs (hash: index -> record)
-- KEYS[19] fleet's parked jobs any server can run (zset), then, for each server of ARGV[8] onwards in the
--          same order, the parked jobs only some servers can run, that one among them (lua/_waiting.lua)
--
-- ARGV[1] now (ms; '' = Redis's clock)   ARGV[4] provider operation id
-- ARGV[2] worker id                      ARGV[5] provider kind (e.g. comfyui)
-- ARGV[3] lease length (ms)              ARGV[6] least time an attempt needs (ms)
-- ARGV[7] job id
-- ARGV[8], ARGV[9], ARGV[10], ... for each server: its name, its cap (prompts in flight), its price
--   (cost units per output; '' = the job's own `price`, the one it was reserved at)
--
-- Returns {0 OK, generation, attempt number, now (ms), server, outputs requested, priority, deadline (ms),
--   max seconds ('' none), workflow (JSON text), index of each output already stored ...} | {7 NOT_FOUND}
--   | {8 NOT_CLAIMABLE, state} | {14 EXPIRED} | {15 NO_CAPACITY} | {16 PAUSED} (parked too)

use_globals(15)
local job = KEYS[1]
local now = clock(ARGV[1])
local f = hmget(job, 'state', 'id', 'deadline', 'servers', 'ckpt')
-- A parked job that only some servers can run, or that names a checkpoint, has its `placement`
-- (_slots.lua) in the fleet hash while it waits, for unpark; it goes when the job leaves the parked set.
local placed = f[4] or f[5]
if f[1] ~= 'queued' then
  redis.call('ZREM', KEYS[14], ARGV[7])  -- a call is answered by this claim, whatever it finds
  leave_parked(KEYS[12], KEYS[13], KEYS[14], ARGV[7])  -- a parked entry of a job that moved on (or is gone) goes
  if not f[1] then return {7} end
  return {8, f[1]}
end
-- Whether jobs wait parked in the shard (this one among them, if it waits). With none, no job is
-- ahead of this one and none is called (a called job stays parked until it claims; a call of a job
-- that left the parked set lapses in `promised`), so neither set is read or written.
local waiting = redis.call('ZCARD', KEYS[13]) > 0
-- a call is answered by this claim, whatever it finds; a called job was promised a slot (unpark)
local called = waiting and redis.call('ZREM', KEYS[14], ARGV[7]) == 1
if now + tonumber(ARGV[6]) >= tonumber(f[3]) then
  if waiting then leave_parked(KEYS[12], KEYS[13], KEYS[14], ARGV[7]) end
  expire_queued(job, {ledger = KEYS[7], queued = KEYS[3], dead = KEYS[8], events = KEYS[5], counts = KEYS[6],
    done = KEYS[9], workflow = KEYS[10], wake = KEYS[11]}, now, 'deadline_passed_while_queued')  -- rare: woken at once
  return {14}
end

local job_id = f[2]
local indexes = parked_indexes(19, 8, 3)
local servers, prices = {}, {}
for i = 8, #ARGV, 3 do
  servers[#servers + 1] = {ARGV[i], tonumber(ARGV[i + 1])}
  prices[ARGV[i]] = ARGV[i + 2]
end
servers = able_servers(servers, f[4])  -- the servers that can run its workflow
local g = hmget(job, 'priority', 'vf', 'tenant', 'price', 'outputs_requested')
local class = g[1] or 'interactive'
local served = 'served:' .. class .. ':' .. (g[3] or '')  -- cost dispatched to the tenant: its share
fleet_view(KEYS[12], servers, {served, 'c:' .. job_id})
local rank = parked_rank(KEYS[13], job_id, g[1], g[2], waiting)  -- interactive before batch, then the tag
local function park()
  redis.call('ZADD', KEYS[13], rank, job_id)
  index_parked(indexes, f[4], rank, job_id)
  if placed then hset(KEYS[12], 'p:' .. job_id, (f[4] or '') .. '|' .. (f[5] or '')) end
end
if paused_for(KEYS[12], class) then  -- `reckon pause --class`: it waits, parked
  park()
  return {16}
end
local server
local calls, ahead, generic = {}, 0, 0
-- the server its call was promised (unpark's `match_calls`), if it was called; the promise is answered
local promised_to = called and hget(KEYS[12], 'c:' .. job_id) or nil
local mine = servers  -- its servers, less the slots promised to other called jobs
if waiting then
  calls = promised(KEYS[14], KEYS[13], now)
  if #calls > 0 then
    local fields, held = {}, {}
    for i, id in ipairs(calls) do fields[i] = 'c:' .. id end
    preload(KEYS[12], fields)
    for _, id in ipairs(calls) do
      local to = hget(KEYS[12], 'c:' .. id)
      if to then held[to] = (held[to] or 0) + 1 else generic = generic + 1 end
    end
    mine = {}
    for i, s in ipairs(servers) do mine[i] = {s[1], s[2] - (held[s[1]] or 0)} end
  end
end
if waiting and not called then  -- a called job takes its promised slot, whoever waits
  ahead = parked_ahead(KEYS[12], KEYS[13], indexes, mine, calls, rank)  -- less paused classes (_waiting.lua)
end
local open = free_slots(KEYS[12], mine) - (called and 0 or generic)  -- its servers' free slots
if ahead < open then  -- else better jobs wait parked for the free slots
  for _, s in ipairs(promised_to and mine or {}) do  -- its promised server first
    if s[1] == promised_to then server = take_slot(KEYS[12], {s}, f[5]) end
  end
  server = server or take_slot(KEYS[12], mine, f[5])
end
if not server then
  park()
  return {15}
end
advance_virtual_time(KEYS[12], class, g[2] or '0')
hincrby(KEYS[12], served, (tonumber(g[4]) or 0) * (tonumber(g[5]) or 1))
local expires = now + tonumber(ARGV[3])
local price = tonumber(prices[server]) or tonumber(hget(job, 'price'))
local gen = hincrby(job, 'lease_gen', 1)
local n = hincrby(job, 'attempt_count', 1)
hset(job, 'lease_owner', ARGV[2], 'lease_expires', expires, 'sends', 0,
  'operation_id', ARGV[4], 'provider', ARGV[5], 'submitted', 0, 'submit_epoch', '', 'submitted_at', 0,
  'attempt_charged', 0, 'server', server, 'slot_held', 1, 'attempt_price', price)
redis.call('ZADD', KEYS[2], expires, job_id)
wake(KEYS[11], job, expires)
redis.call('ZREM', KEYS[3], job_id)
if waiting then redis.call('ZREM', KEYS[13], job_id) end
if waiting then
  hdel(KEYS[12], 'p:' .. job_id, 'c:' .. job_id)  -- its placement and promise, if any
  unindex_parked(indexes, f[4], job_id)
end
redis.call('HSET', KEYS[4], n, cjson.encode({
  number = n, worker = ARGV[2], generation = gen, provider = ARGV[5], server = server, price = price,
  operation_id = ARGV[4], state = 'running', started_at = now,
  submitted_at = cjson.null, ended_at = cjson.null, error_class = cjson.null}))
move(job, KEYS[6], KEYS[5], now, 'queued', 'running', 'claimed')
local inputs = hmget(job, 'outputs_requested', 'priority', 'deadline', 'max_seconds')
-- outputs are stored only by attempts (and the reconciliations of theirs): a first attempt finds none
local stored = n > 1 and redis.call('HKEYS', KEYS[18]) or {}
return {0, gen, n, now, server, inputs[1], inputs[2], inputs[3], inputs[4] or '', redis.call('GET', KEYS[10]) or '',
  unpack(stored)}
