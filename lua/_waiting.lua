-- The parked jobs' indexes by server, beside the shard's parked set (after lua/_slots.lua in the
-- prelude, whose helpers it uses). Each parked job is also in `parked-any` if any server can run it,
-- else in `parked-on:<server>` of each server its record names (`servers`), scored as in the parked
-- set: when it parked, and again when the starvation bound moves it ahead or sends it back (`age_batch`,
-- `reindex_parked`). So an unpark finds the best jobs a free server can run, and a claim counts only
-- the better-ranked parked jobs that could take its servers' free slots, in O(log n) whatever the
-- backlog of other servers. An entry whose job left the parked set (claimed, cancelled, failed) is
-- dropped when an unpark or a claim's count meets it (`index_head`), never counted, so the scripts a job
-- leaves by need not know the indexes; a claim drops its own.
-- `indexes` maps a server's name to its index key, and '' to `parked-any`.

-- The index keys of a script's servers: `first` is `parked-any`'s place in KEYS, then one per server of
-- ARGV (its name at `from`, every `step` arguments), in the same order.
local function parked_indexes(first, from, step)
  local indexes = {[''] = KEYS[first]}
  for i = from, #ARGV, step do indexes[ARGV[i]] = KEYS[first + 1 + (i - from) / step] end
  return indexes
end

-- The index keys of a job (`named`: its record's `servers`, '' or nil for any server).
local function job_indexes(indexes, named)
  if not named or named == '' then return {indexes['']} end
  local found = {}
  for name in string.gmatch(named, '[^,]+') do
    if indexes[name] then found[#found + 1] = indexes[name] end
  end
  return found
end

local function index_parked(indexes, named, rank, job_id)
  for _, key in ipairs(job_indexes(indexes, named)) do redis.call('ZADD', key, rank, job_id) end
end

local function unindex_parked(indexes, named, job_id)
  for _, key in ipairs(job_indexes(indexes, named)) do redis.call('ZREM', key, job_id) end
end

-- The jobs whose score in the parked set `age_batch` changed (`changed`: score, id, ...) take the same score in
-- their indexes: one HMGET of their `placement` (none if read already), one ZADD XX per index they are in.
local function reindex_parked(fleet, indexes, changed)
  if #changed == 0 then return end
  local fields, by_key, touched = {}, {}, {}
  for i = 2, #changed, 2 do fields[#fields + 1] = 'p:' .. changed[i] end
  preload(fleet, fields)
  for i = 1, #changed, 2 do
    for _, key in ipairs(job_indexes(indexes, (placement(fleet, changed[i + 1])))) do
      if not by_key[key] then by_key[key], touched[#touched + 1] = {}, key end
      local items = by_key[key]
      items[#items + 1], items[#items + 2] = changed[i], changed[i + 1]
    end
  end
  for _, key in ipairs(touched) do redis.call('ZADD', key, 'XX', unpack(by_key[key])) end
end

-- Up to `count` jobs of `index` still parked, best first, of index scores `lo` to `hi`: {id, score in the
-- parked set, ...}. Entries of jobs no longer parked are dropped on the way (each once).
local function index_head(parked, index, count, lo, hi)
  local live, offset = {}, 0
  while #live / 2 < count do
    local ids = redis.call('ZRANGEBYSCORE', index, lo, hi, 'LIMIT', offset, count - #live / 2)
    if #ids == 0 then break end
    local scores, gone = redis.call('ZMSCORE', parked, unpack(ids)), {}
    for i, id in ipairs(ids) do
      if scores[i] then live[#live + 1], live[#live + 2] = id, scores[i] else gone[#gone + 1] = id end
    end
    if #gone == 0 then break end  -- all live: as many as asked, or the index's end
    redis.call('ZREM', index, unpack(gone))
    offset = offset + #ids - #gone
  end
  return live
end

-- How many parked jobs rank ahead of a claim of rank `rank` and could take a free slot of one of its
-- servers (`mine`: {name, cap} pairs, less the slots promised to called jobs), counted up to as many as
-- those slots (no more matter): those still parked in `parked-any` and in the index of each of its servers
-- with a slot free, once each (`index_head`: an entry of a job that left, cancelled or failed, is dropped,
-- not counted; a job two free servers can run is in both of their indexes), and those moved past the
-- starvation bound (below 0 in the parked set; from its head, as many as could matter) that one of those
-- servers can run; not the
-- called ones (`calls`: their promised slots are counted apart). A paused class waits behind: while
-- interactive is paused (this job is batch) interactive jobs are not counted; while batch is paused
-- (this job is interactive) only interactive ones are. Ranks are compared with every digit (`redis_text`:
-- tags keep their fractions). 0 when no server of its has a slot free.
local function parked_ahead(fleet, parked, indexes, mine, calls, rank)
  local skip = rank >= 0 and paused_for(fleet, 'interactive')
  local only_interactive = paused_for(fleet, 'batch')
  local counted, free, open = {indexes['']}, {}, 0
  for _, server in ipairs(mine) do
    local busy = server_busy(fleet, server[1])
    if busy and busy < server[2] then
      free[server[1]], open = true, open + server[2] - busy
      if indexes[server[1]] then counted[#counted + 1] = indexes[server[1]] end
    end
  end
  if open == 0 then return 0 end
  local ahead, seen = 0, {}
  for _, id in ipairs(calls) do seen[id] = true end  -- their promised slots are counted apart
  for _, key in ipairs(rank >= 0 and counted or {}) do
    local live = index_head(parked, key, open + #calls, skip and BATCH_RANK or 0, '(' .. redis_text(rank))
    for i = 1, #live, 2 do
      if not seen[live[i]] then seen[live[i]], ahead = true, ahead + 1 end
    end
    if ahead >= open then return ahead end
  end
  if only_interactive then return ahead end
  local moved, read = redis.call('ZRANGEBYSCORE', parked, '-inf', '(' .. redis_text(math.min(rank, 0)),
    'LIMIT', 0, open + #calls), {}
  for _, id in ipairs(moved) do read[#read + 1], read[#read + 2] = id, 0 end
  read_parked(fleet, read)
  for _, id in ipairs(moved) do
    for _, server in ipairs(seen[id] and {} or able_servers(mine, (placement(fleet, id)))) do
      if free[server[1]] then ahead = ahead + 1 break end
    end
  end
  return ahead
end

-- The parked jobs of `best` and `more` ({id, score, ...} each), once each, in rank order (as ZRANGE: score,
-- then id). `best` is in that order already (a ZRANGE's): when `more` adds no job to it, it is the answer
-- as it is (the common case, the indexes' heads being jobs of the parked set's head), with no sort.
local function merge_ranked(best, more)
  local seen, items, merged = {}, {}, {}
  for i = 1, #best, 2 do seen[best[i]] = true end
  local new = false
  for i = 1, #more, 2 do
    if not seen[more[i]] then new = true break end
  end
  if not new then return best end
  seen = {}
  for _, list in ipairs({best, more}) do
    for i = 1, #list, 2 do
      if not seen[list[i]] then seen[list[i]], items[#items + 1] = true, {list[i], tonumber(list[i + 1])} end
    end
  end
  table.sort(items, function(a, b) return a[2] < b[2] or (a[2] == b[2] and a[1] < b[1]) end)
  for _, item in ipairs(items) do merged[#merged + 1], merged[#merged + 2] = item[1], item[2] end
  return merged
end
