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

-- How many `calls` (as `promised` read them) hold a slot of `servers` ({name, cap} pairs): those promised
-- one of them (`c:<job id>` in the fleet hash), or no server. A call promised another server holds none:
-- a freed server's unpark is not held back by a call to another server whose job has not claimed yet.
local function calls_held(fleet, servers, calls)
  if #calls == 0 then return 0 end
  local fields, here, held = {}, {}, 0
  for i, id in ipairs(calls) do fields[i] = 'c:' .. id end
  preload(fleet, fields)
  for _, server in ipairs(servers) do here[server[1]] = true end
  for _, id in ipairs(calls) do
    local to = hget(fleet, 'c:' .. id)
    if not to or here[to] then held = held + 1 end
  end
  return held
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
-- called before `release`. True if it gave the slot back (false: given back already, by
-- lua/prompt-ended.lua once the prompt ended at its server, or never taken).
local function free_slot(job, fleet)
  local f = hmget(job, 'server', 'slot_held', 'id', 'lease_owner')
  if f[4] == 'watcher' then redis.call('HDEL', fleet, 'w:' .. f[3]) end
  if f[2] == '1' then
    add(fleet, 'busy:' .. f[1], -1)
    hset(job, 'slot_held', 0)
    return true
  end
  return false
end

-- Keeps the job's dispatch slot for a prompt that may still occupy its server, past the job's
-- attempt (a review of a prompt the server last said was running): the slot moves from the record
-- (`slot_held` 0, so no later step of the job gives it back) to the fleet hash's `k:<job id>/<operation
-- id>` (`{server, since}`), where the server's count (`busy:<server>`) stays taken until the watcher
-- hears that the prompt is gone (lua/slot-let-go.lua). Ends the watch of the prompt as free_slot does.
local function keep_slot(job, fleet, now)
  local f = hmget(job, 'server', 'slot_held', 'id', 'lease_owner', 'operation_id')
  if f[4] == 'watcher' then redis.call('HDEL', fleet, 'w:' .. f[3]) end
  if f[2] == '1' then
    redis.call('HSET', fleet, 'k:' .. f[3] .. '/' .. f[5], cjson.encode({server = f[1], since = now}))
    hset(job, 'slot_held', 0)
  end
end

-- Fair dispatch between tenants (start-time fair queueing, by cost): each job gets a finish tag
-- when it is admitted, F = max(V, the tenant's last F in the class) + cost / weight, where cost is
-- the job's reserved price times its outputs and weight the tenant's (`reckon tenant set --weight`,
-- default 1). Parked jobs wait by class, then tag; V, the shard's virtual time per class
-- (`vt:<class>` in the fleet hash), is the highest tag that took a slot, so a tenant that was idle
-- starts level with the others instead of ahead by all it did not use. Tags count tenths of a cost
-- unit, unrounded (a job of no cost counts a tenth of a unit, so it still takes its turn): text with
-- every digit of the double (`redis_text`; whole numbers as before). A parked job's score (1e13 for
-- batch, plus its tag) holds the tag to within 2^-10 of a tenth while tags stay below 7.6e12: a tenth
-- of the smallest step (a 1-unit job at weight 1000, 0.01). Interactive tags must stay below 1e13:
-- a shard's class can serve 1e12 cost units at weight 1 (1e9 at the lowest weight, 0.001).
-- Returns F as text.
local TAG_SCALE = 10
local function finish_tag(fleet, class, last, cost, weight)
  preload(fleet, {'vt:' .. class})  -- read with the class's pause (`paused_for`): no command of its own
  local v = tonumber(hget(fleet, 'vt:' .. class) or '0')
  local w = tonumber(weight)
  if not w or w <= 0 then w = 1 end
  return redis_text(math.max(v, tonumber(last) or 0) + math.max(cost, 0.1) * TAG_SCALE / w)
end

-- A job that took a slot moves its class's virtual time up to its tag (read by `fleet_view`, written
-- with the slot it took: no command of its own).
local function advance_virtual_time(fleet, class, tag)
  local field = 'vt:' .. class
  preload(fleet, {field})
  if tonumber(tag) > tonumber(hget(fleet, field) or '0') then hset(fleet, field, tag) end
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

-- No starvation of batch behind interactive, without first come, first served among batch: while a
-- batch job queued longer than `bound` ms waits parked in its own place and some usable server (not
-- stopped: full is usable) can run it, the parked batch jobs next in fair order (lowest tags) that a
-- usable server can run are moved ahead of every other parked job, up to AGED moved at a time (score:
-- less twice BATCH_RANK, so the tag less 1e13: below every interactive score, in tag order). So batch
-- goes before interactive, fairly among its tenants, until each such job past the bound has been moved.
-- A job no usable server can run neither moves others nor is moved, and a moved one whose servers have
-- all stopped goes back to its tag: it holds none of the AGED places while it cannot run. `queue` is the
-- shard's queue (G.queue: class rank + when queued): the oldest batch jobs are found in O(log n), no
-- scan. Jobs that cannot run are looked past in the queue and in tag order up to AGED_LOOK each. A job
-- already moved keeps its (lower) score: ZADD's XX LT. `servers` are unpark's ({name, cap} pairs).
-- Returns the jobs whose score it changed, moved or sent back ({score, id, ...}), for their entries in the
-- parked indexes (`reindex_parked` in lua/_waiting.lua).
local AGED, AGED_LOOK = 16, 256

-- Whether some usable server of `servers` can run the parked job `id` (its `placement` read already).
-- `stopped` is false while no server is stopped: any job can, and no placement need be read; else a
-- table of the answers by placement so far (jobs share a few).
local function runnable(fleet, servers, stopped, id)
  if not stopped then return true end
  local named = placement(fleet, id) or ''
  if stopped[named] == nil then
    stopped[named] = false
    for _, server in ipairs(able_servers(servers, named)) do
      if server_busy(fleet, server[1]) then stopped[named] = true break end
    end
  end
  return stopped[named]
end

-- Reads the `placement` of the jobs `ids` (id, score, ... when `scored`) at once, while a server is
-- stopped: one HMGET, none if all are known.
local function read_placements(fleet, stopped, ids, scored)
  local fields, step = {}, scored and 2 or 1
  for i = 1, #ids, step do fields[#fields + 1] = 'p:' .. ids[i] end
  if stopped and #fields > 0 then preload(fleet, fields) end
end

-- Moves the moved jobs (at most AGED: `age_batch` keeps no more) that no usable server can run back to
-- their tags, each added to `changed` (score, id, ...); returns how many stay moved.
local function moved_runnable(fleet, servers, stopped, parked, changed)
  local band = redis.call('ZRANGEBYSCORE', parked, '-inf', '(0', 'WITHSCORES', 'LIMIT', 0, AGED)
  read_placements(fleet, stopped, band, true)
  local back, kept = {}, 0
  for i = 1, #band, 2 do
    if runnable(fleet, servers, stopped, band[i]) then kept = kept + 1
    else back[#back + 1], back[#back + 2] = tonumber(band[i + 1]) + 2 * tonumber(BATCH_RANK), band[i] end
  end
  if #back > 0 then redis.call('ZADD', parked, 'XX', unpack(back)) end
  for _, item in ipairs(back) do changed[#changed + 1] = item end
  return kept
end

-- Whether one of the batch jobs queued before `cutoff` (a queue score) waits parked unmoved and can run:
-- `ids`, the oldest AGED of them, then (past jobs moved, not parked or that cannot run) up to AGED_LOOK.
local function overdue_waits(fleet, servers, stopped, parked, queue, cutoff, ids)
  local rank, offset = tonumber(BATCH_RANK), 0
  while true do
    local waiting = {}
    for i, score in ipairs(redis.call('ZMSCORE', parked, unpack(ids))) do
      if score and tonumber(score) >= rank then waiting[#waiting + 1] = ids[i] end
    end
    read_placements(fleet, stopped, waiting)
    for _, id in ipairs(waiting) do
      if runnable(fleet, servers, stopped, id) then return true end
    end
    offset = offset + #ids
    if #ids < AGED or offset >= AGED_LOOK then return false end
    ids = redis.call('ZRANGEBYSCORE', queue, rank, cutoff, 'LIMIT', offset, AGED_LOOK - offset)
    if #ids == 0 then return false end
  end
end

local function age_batch(fleet, servers, parked, queue, now, bound)
  local rank, changed = tonumber(BATCH_RANK), {}
  local overdue = redis.call('ZRANGEBYSCORE', queue, rank, rank + now - bound, 'LIMIT', 0, AGED)
  if #overdue == 0 then return changed end
  local stopped = false
  for _, server in ipairs(servers) do
    if not server_busy(fleet, server[1]) then stopped = {} end
  end
  local room = AGED - moved_runnable(fleet, servers, stopped, parked, changed)
  if room <= 0 or not overdue_waits(fleet, servers, stopped, parked, queue, rank + now - bound, overdue) then
    return changed
  end
  local moves, offset, count = {}, 0, room + AGED  -- one ZADD for all of them
  while room > 0 and offset < AGED_LOOK do
    local fairest = redis.call('ZRANGEBYSCORE', parked, BATCH_RANK, '+inf', 'WITHSCORES', 'LIMIT', offset, count)
    read_placements(fleet, stopped, fairest, true)
    for i = 1, #fairest, 2 do
      if room > 0 and runnable(fleet, servers, stopped, fairest[i]) then
        moves[#moves + 1], moves[#moves + 2], room = tonumber(fairest[i + 1]) - 2 * rank, fairest[i], room - 1
      end
    end
    if #fairest / 2 < count then break end
    offset, count = offset + count, AGED_LOOK - offset - count
  end
  if #moves > 0 then redis.call('ZADD', parked, 'XX', 'LT', unpack(moves)) end
  for _, item in ipairs(moves) do changed[#changed + 1] = item end
  return changed
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
-- Only the called jobs' promises are read, and the others' placements as the matching reaches them,
-- `open` + AFFINITY_WINDOW first, then twice as many each time (one HMGET each): a free slot is most often
-- filled by the first jobs.
local function match_calls(fleet, servers, best, calls, open)
  local called, promises = {}, {}
  for _, id in ipairs(calls) do called[id] = true end
  for i = 1, #best, 2 do
    if called[best[i]] then promises[#promises + 1] = 'c:' .. best[i] end
  end
  if #promises > 0 then preload(fleet, promises) end
  local free, warm = {}, {}
  for _, server in ipairs(servers) do
    local busy = server_busy(fleet, server[1])
    if busy then free[server[1]] = math.max(0, server[2] - busy) end
    warm[server[1]] = hget(fleet, 'ckpt:' .. server[1]) or nil
  end
  local waiting = {}  -- positions in `best` of the jobs not called yet
  for i = 1, #best, 2 do
    if called[best[i]] then  -- called already: its promised server's slot is its
      local promised_to = hget(fleet, 'c:' .. best[i])
      if promised_to and (free[promised_to] or 0) > 0 then free[promised_to] = free[promised_to] - 1 end
    else
      waiting[#waiting + 1] = i
    end
  end
  local jobs, chunk = {}, open + AFFINITY_WINDOW
  local function job_at(j)  -- the j-th job not called, its placement read (nil past the last)
    if not jobs[j] and waiting[j] then
      local fields = {}
      for k = j, math.min(#waiting, j + chunk - 1) do fields[#fields + 1] = 'p:' .. best[waiting[k]] end
      preload(fleet, fields)
      for k = j, math.min(#waiting, j + chunk - 1) do
        local at = waiting[k]
        local named, ckpt = placement(fleet, best[at])
        local job = {at = at, able = {}, ckpt = ckpt, batch = tonumber(best[at + 1]) >= tonumber(BATCH_RANK)}
        for _, server in ipairs(able_servers(servers, named)) do job.able[server[1]] = true end
        jobs[k] = job
      end
      chunk = chunk * 2  -- a scan past the first jobs reads on in larger steps
    end
    return jobs[j]
  end
  local picked, count = {}, 0
  for _, server in ipairs(servers) do
    local name = server[1]
    while count < open and (free[name] or 0) > 0 do
      local first, choice
      local j = 1
      while job_at(j) do
        local job = jobs[j]
        if not picked[j] and job.able[name] then
          if not first then
            first = j
            if not (job.batch and warm[name] and job.ckpt ~= warm[name]) then choice = j break end
          elseif j - first > AFFINITY_WINDOW then break
          elseif job.batch and job.ckpt == warm[name] then choice = j break end
        end
        j = j + 1
      end
      choice = choice or first
      if not choice then break end
      picked[choice], count, free[name] = name, count + 1, free[name] - 1
      warm[name] = jobs[choice].ckpt or warm[name]
    end
  end
  local chosen = {}
  for j = 1, #waiting do
    if picked[j] then
      chosen[#chosen + 1] = jobs[j].at
      hset(fleet, 'c:' .. best[jobs[j].at], picked[j])
    end
  end
  return chosen
end

-- A job leaves the parked set for good (it failed or is gone): its entry, its call and its fields in the
-- fleet hash (`p:` its placement, `c:` the server its call was promised) go, whether it had them or not.
local function leave_parked(fleet, parked, called, job_id)
  if redis.call('ZREM', parked, job_id) == 1 then
    redis.call('ZREM', called, job_id)
    redis.call('HDEL', fleet, 'p:' .. job_id, 'c:' .. job_id)
  end
end
