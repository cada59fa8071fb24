-- The fleet's dispatch slots, shared by the scripts that claim, park and free them (after
-- _lib.lua in the library's prelude: the loader joins the `lua/_*.lua` files in name order).
-- Each server's slots in flight and its stops are fields of the shard's fleet hash.

-- Why dispatch to a server is stopped; each is a field `<reason>:<server>` of the fleet hash.
local SERVER_BLOCKS = {'dispatch_paused', 'provider_credentials', 'provider_unreachable'}

-- A server's prompts in flight (busy slots), or nil while dispatch to it is stopped.
local function server_fields(name)
  local fields = {'busy:' .. name}
  for _, reason in ipairs(SERVER_BLOCKS) do fields[#fields + 1] = reason .. ':' .. name end
  return fields
end

-- Reads at once every field of the fleet hash that dispatch to `servers` ({name, cap} pairs) may
-- ask, and the caller's `extra` fields (the helpers below read from this copy: lua/_cache.lua).
local function fleet_view(fleet, servers, extra)
  local fields = {'rr', 'pause_class:interactive', 'pause_class:batch', 'vt:interactive', 'vt:batch', unpack(extra or {})}
  for _, server in ipairs(servers) do
    for _, field in ipairs(server_fields(server[1])) do fields[#fields + 1] = field end
    fields[#fields + 1] = 'ckpt:' .. server[1]
  end
  preload(fleet, fields)
end

local function server_busy(fleet, name)
  local fields = server_fields(name)
  preload(fleet, fields)
  local f = hmget(fleet, unpack(fields))
  if f[2] or f[3] or f[4] then return nil end
  return tonumber(f[1] or '0')
end

-- Why dispatch of a job of `class` to `server` (nil: any) must wait: its class is paused
-- (`pause_class:<class>` in the fleet hash) or its server is; nil when it may go.
local function paused_for(fleet, class, server)
  preload(fleet, {'pause_class:' .. class, 'vt:' .. class, server and 'dispatch_paused:' .. server or nil})
  if hget(fleet, 'pause_class:' .. class) then return 'class_paused' end
  if server and hget(fleet, 'dispatch_paused:' .. server) then return 'dispatch_paused' end
  return nil
end

-- Free slots on the usable servers of `servers` ({name, cap} pairs).
local function free_slots(fleet, servers)
  local free = 0
  for _, server in ipairs(servers) do
    local busy = server_busy(fleet, server[1])
    if busy then free = free + math.max(0, server[2] - busy) end
  end
  return free
end

-- The jobs called to a slot and not yet claimed, each holding a promised slot. A call whose
-- time ran out (its message was lost) or whose job left the parked set (claimed, cancelled,
-- failed) is dropped; a called job keeps its place in the parked set until it claims.
local function promised(called, parked, now)
  redis.call('ZREMRANGEBYSCORE', called, '-inf', now)
  local live = {}
  for _, id in ipairs(redis.call('ZRANGE', called, 0, -1)) do
    if redis.call('ZSCORE', parked, id) then live[#live + 1] = id else redis.call('ZREM', called, id) end
  end
  return live
end

-- Takes a dispatch slot on a usable server of `servers` ({name, cap} pairs) with a slot free:
-- one that last took a job of checkpoint `ckpt` (the job's `ckpt`, a digest of its first
-- checkpoint; `ckpt:<server>` in the fleet hash) if any, so its GPU need not load another model;
-- else the least loaded, turning the round-robin start each time so equal loads share the work.
-- Returns the server's name, or nil when every server is stopped or at its cap.
local function take_slot(fleet, servers, ckpt)
  preload(fleet, {'rr'})
  local start = hincrby(fleet, 'rr', 1)
  local best, best_key
  for i = 0, #servers - 1 do
    local server = servers[(start + i) % #servers + 1]
    local busy = server_busy(fleet, server[1])
    if busy and busy < server[2] then
      local warm = ckpt and ckpt ~= '' and hget(fleet, 'ckpt:' .. server[1]) == ckpt
      local key = (warm and 0 or 1e9) + busy
      if not best or key < best_key then best, best_key = server[1], key end
    end
  end
  if best then
    hincrby(fleet, 'busy:' .. best, 1)
    if ckpt and ckpt ~= '' then hset(fleet, 'ckpt:' .. best, ckpt) end
  end
  return best
end

-- The servers of `servers` ({name, cap} pairs) a job may run on: those its record names (`servers`,
-- comma-separated: set at admission when not every server can run its workflow), else all.
local function able_servers(servers, named)
  if not named or named == '' then return servers end
  local allowed, able = {}, {}
  for name in string.gmatch(named, '[^,]+') do allowed[name] = true end
  for _, server in ipairs(servers) do
    if allowed[server[1]] then able[#able + 1] = server end
  end
  return able
end

-- Gives back the job's dispatch slot, once (the claim took it), and ends the watch of
-- its prompt at the provider, if any: the watch list holds a job exactly while the watcher
-- holds its lease (`await` hands it over, collect-claim and reconcile-begin take it back), so
-- called before `release`.
local function free_slot(job, fleet)
  local f = hmget(job, 'server', 'slot_held', 'id', 'lease_owner')
  if f[4] == 'watcher' then redis.call('HDEL', fleet, 'w:' .. f[3]) end
  if f[2] == '1' then
    add(fleet, 'busy:' .. f[1], -1)
    hset(job, 'slot_held', 0)
  end
end

-- Fair dispatch between tenants (start-time fair queueing, by cost): each job gets a finish tag
-- when it is admitted, F = max(V, the tenant's last F in the class) + cost / weight, where cost is
-- the job's reserved price times its outputs and weight the tenant's (`reckon tenant set --weight`,
-- default 1). Parked jobs wait by class, then tag; V, the shard's virtual time per class
-- (`vt:<class>` in the fleet hash), is the highest tag that took a slot, so a tenant that was idle
-- starts level with the others instead of ahead by all it did not use. Tags count tenths of a cost
-- unit, whole numbers: a parked job's score (1e13 for batch, plus its tag) must stay exact through
-- Lua's 14 significant digits, which also bounds a shard's lifetime to 1e12 cost units per class.
-- Returns F as text.
local TAG_SCALE = 10
local function finish_tag(fleet, class, last, cost, weight)
  preload(fleet, {'vt:' .. class})  -- read with the class's pause (`paused_for`): no command of its own
  local v = tonumber(hget(fleet, 'vt:' .. class) or '0')
  local w = tonumber(weight)
  if not w or w <= 0 then w = 1 end
  local step = math.max(1, math.floor(cost * TAG_SCALE / w + 0.5))
  return string.format('%d', math.max(v, tonumber(last) or 0) + step)
end

-- A job that took a slot moves its class's virtual time up to its tag (read by `fleet_view`, written
-- with the slot it took: no command of its own).
local function advance_virtual_time(fleet, class, tag)
  local field = 'vt:' .. class
  preload(fleet, {field})
  if tonumber(tag) > tonumber(hget(fleet, field) or '0') then hset(fleet, field, tag) end
end

-- No starvation of batch behind interactive: moves up to AGED of the oldest batch jobs queued for
-- longer than `bound` ms and parked ahead of every other parked job (score: when queued, less
-- BATCH_RANK: negative, so below every interactive score, oldest first). `queue` is the shard's
-- queue (G.queue: class rank + when queued), so they are found in O(log n), no scan. A job already
-- moved keeps its (lower) score: ZADD's XX LT.
local AGED = 16
local function age_batch(parked, queue, now, bound)
  local rank = tonumber(BATCH_RANK)
  local aged = redis.call('ZRANGEBYSCORE', queue, rank, rank + now - bound, 'WITHSCORES', 'LIMIT', 0, AGED)
  if #aged == 0 then return end
  local moves = {}  -- one ZADD for all of them
  for i = 1, #aged, 2 do moves[#moves + 1], moves[#moves + 2] = tonumber(aged[i + 1]) - 2 * rank, aged[i] end
  redis.call('ZADD', parked, 'XX', 'LT', unpack(moves))
end

-- A job's place among the parked: its class rank plus its finish tag, or the lower place it was
-- moved up to past the starvation bound (`age_batch`) while it waited parked.
local function parked_rank(parked, job_id, class, tag, waiting)
  local rank = class_rank(class) + tonumber(tag or '0')  -- no tag: admitted before fair dispatch
  if not waiting or class ~= 'batch' then return rank end
  local moved = tonumber(redis.call('ZSCORE', parked, job_id) or '')
  if moved and moved < 0 then return moved end
  return rank
end

-- A parked job that only some servers can run, or that names a checkpoint, has `p:<job id>` ->
-- '<servers>|<ckpt>' in the fleet hash while it waits (claim.lua writes it when the job parks and
-- removes it when the job leaves): what unpark needs to match it to a free slot.
local function placement(fleet, job_id)
  local value = hget(fleet, 'p:' .. job_id)
  if not value then return nil, nil end
  local named, ckpt = string.match(value, '^([^|]*)|(.*)$')
  return (named ~= '' and named or nil), (ckpt ~= '' and ckpt or nil)
end

-- How far a batch job whose checkpoint a free server has loaded may go before batch jobs that would
-- make it load another (they are passed over until the starvation bound moves them first).
local AFFINITY_WINDOW = 8

-- Reads the fields unpark needs of parked jobs (`best`: id, score, ...): each one's `placement` and, for
-- a called one, the server its call was promised (`c:<job id>`); one HMGET for those not read yet.
local function read_parked(fleet, best)
  local fields = {}
  for i = 1, #best, 2 do fields[#fields + 1], fields[#fields + 2] = 'p:' .. best[i], 'c:' .. best[i] end
  if #fields > 0 then preload(fleet, fields) end
end

-- Matches parked jobs (`best`: id, score, id, score, ... in rank order) to the free slots of `servers`,
-- at most `open` of them: each free slot takes the best job that can run on its server (`placement`),
-- a batch job whose checkpoint the server has loaded (`ckpt:<server>`) before up to AFFINITY_WINDOW
-- batch ones that would load another; interactive jobs, and batch jobs past the starvation bound,
-- are never passed over. Each call is promised its server (`c:<job id>` in the fleet hash, which its
-- claim takes, and other claims leave to it); a job called already (in `calls`, as `promised` read
-- them) holds its promised server's slot. Returns the positions in `best` of the jobs to call, in rank order.
local function match_calls(fleet, servers, best, calls, open)
  local called = {}
  for _, id in ipairs(calls) do called[id] = true end
  read_parked(fleet, best)
  local free, warm = {}, {}
  for _, server in ipairs(servers) do
    local busy = server_busy(fleet, server[1])
    if busy then free[server[1]] = math.max(0, server[2] - busy) end
    warm[server[1]] = hget(fleet, 'ckpt:' .. server[1]) or nil
  end
  local jobs = {}
  for i = 1, #best, 2 do
    local named, ckpt = placement(fleet, best[i])
    local job = {at = i, able = {}, ckpt = ckpt, batch = tonumber(best[i + 1]) >= tonumber(BATCH_RANK)}
    for _, server in ipairs(able_servers(servers, named)) do job.able[server[1]] = true end
    if called[best[i]] then  -- called already: its promised server's slot is its
      local promised_to = hget(fleet, 'c:' .. best[i])
      if promised_to and (free[promised_to] or 0) > 0 then free[promised_to] = free[promised_to] - 1 end
    else
      jobs[#jobs + 1] = job
    end
  end
  local picked, count = {}, 0
  for _, server in ipairs(servers) do
    local name = server[1]
    while count < open and (free[name] or 0) > 0 do
      local first, choice
      for j, job in ipairs(jobs) do
        if not picked[j] and job.able[name] then
          if not first then
            first = j
            if not (job.batch and warm[name] and job.ckpt ~= warm[name]) then choice = j break end
          elseif j - first > AFFINITY_WINDOW then break
          elseif job.batch and job.ckpt == warm[name] then choice = j break end
        end
      end
      choice = choice or first
      if not choice then break end
      picked[choice], count, free[name] = name, count + 1, free[name] - 1
      warm[name] = jobs[choice].ckpt or warm[name]
    end
  end
  local calls = {}
  for j, job in ipairs(jobs) do
    if picked[j] then
      calls[#calls + 1] = job.at
      hset(fleet, 'c:' .. best[job.at], picked[j])
    end
  end
  return calls
end

-- A job leaves the parked set for good (it failed or is gone): its entry, its call and its fields in the
-- fleet hash (`p:` its placement, `c:` the server its call was promised) go, whether it had them or not.
local function leave_parked(fleet, parked, called, job_id)
  if redis.call('ZREM', parked, job_id) == 1 then
    redis.call('ZREM', called, job_id)
    redis.call('HDEL', fleet, 'p:' .. job_id, 'c:' .. job_id)
  end
end
