-- Per-call copies of the hashes a script reads and writes, so that each costs a fixed handful of
-- commands per call instead of one per field. Prepended to every script before _lib.lua; the
-- library runs `save_records` when a script's body returns (pipeline/state/scripts.py).
--
-- Records (`hget`, `hmget`, `hset`, `hincrby`, `hdel`): the first read of a record in a call reads
-- the whole hash (HGETALL: a job record, an attempts hash), or, for a hash declared `partial`
-- (the fleet: one field per watched prompt), only the fields asked for (one HMGET for each
-- `preload`). Writes go to the copy, and `save_records` writes each record's changed fields in one
-- HSET. A write needs no read first. Values are kept as the strings Redis keeps; a field that is
-- not there reads as false, as HGET's nil does in Lua.
--
-- Counters (`bump`; `toward` for an average): changes to a figures hash the call never reads back
-- (the shard's stats, a tenant's per-state counts), added up and written when the call ends: one HINCRBY(FLOAT) for a
-- single field, else one HMGET (of the values the call has not read already, say by a `preload`)
-- and one HSET for all of them, with the copy's own writes to that hash.

local RECORDS, BUMPS = {}, {}
-- The fields a finished job's packed record holds in its field `z` (set in lua/_codec.lua).
local packed_fields

-- What Redis stores for a value a script passes: integers without a fraction.
local function redis_text(value)
  if type(value) == 'number' then
    if value == math.floor(value) and math.abs(value) < 2^53 then return string.format('%d', value) end
    return string.format('%.17g', value)
  end
  return value
end

local function record_of(key)
  local r = RECORDS[key]
  if not r then
    r = {f = {}, dirty = {}, known = {}}
    RECORDS[key] = r
  end
  return r
end

-- Declares `key` partial (only asked-for fields are read) and reads `fields` not known yet, at once.
local function preload(key, fields)
  local r = record_of(key)
  r.partial = true
  local missing = {}
  for _, field in ipairs(fields) do
    if not (r.all or r.known[field]) then missing[#missing + 1] = field end
  end
  if #missing == 0 then return end
  local values = redis.call('HMGET', key, unpack(missing))
  for i, field in ipairs(missing) do
    if not r.dirty[field] then r.f[field] = values[i] or nil end
    r.known[field] = true
  end
end

local function known(r, key, field)
  if r.all or r.known[field] then return end
  if r.partial then return preload(key, {field}) end
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    if not r.known[flat[i]] then r.f[flat[i]] = flat[i + 1] end
  end
  r.all = true
  if r.f.z and string.find(key, ':job:[^:]*$') then  -- a finished job: its fields are packed
    for name, text in pairs(packed_fields(key, r.f.z)) do
      if r.f[name] == nil and not r.known[name] then r.f[name] = text end
    end
  end
end

local function hget(key, field)
  local r = record_of(key)
  known(r, key, field)
  local v = r.f[field]
  if v == nil then return false end
  return v
end

local function hmget(key, ...)
  local out = {}
  for i, field in ipairs({...}) do out[i] = hget(key, field) end
  return out
end

local function hset(key, ...)
  local r, args = record_of(key), {...}
  for i = 1, #args, 2 do
    r.f[args[i]], r.dirty[args[i]], r.known[args[i]] = redis_text(args[i + 1]), true, true
  end
end

local function hincrby(key, field, amount)
  local value = tonumber(hget(key, field) or '0') + tonumber(amount)
  hset(key, field, value)
  return value
end

local function hdel(key, ...)
  local r = record_of(key)
  redis.call('HDEL', key, ...)
  for _, field in ipairs({...}) do r.f[field], r.dirty[field], r.known[field] = nil, nil, true end
end

-- Every field of a record (not a partial one), as a table field -> value.
local function hgetall(key)
  local r = record_of(key)
  known(r, key, '')
  return r.f
end

-- How many fields a record (not a partial one) has.
local function hlen(key)
  local n = 0
  for _ in pairs(hgetall(key)) do n = n + 1 end
  return n
end

-- Adds `amount` to a field: in the copy if the call has read it, else at once (HINCRBY, no read).
local function add(key, field, amount)
  local r = RECORDS[key]
  if r and (r.all or r.known[field]) then return hincrby(key, field, amount) end
  return redis.call('HINCRBY', key, field, amount)
end

-- The record is written anew when the call ends (the caller DELs its key): `fields` (field -> value)
-- and nothing else, in one HSET.
local function rewrite(key, fields)
  RECORDS[key] = {f = fields, dirty = {}, known = {}, all = true, rewrite = true}
end

-- The record is gone (DEL): nothing of it is written back.
local function forget(key) RECORDS[key] = {f = {}, dirty = {}, known = {}, all = true} end

-- The record is new (an id no record had): there is nothing to read, a field not written reads as
-- false, and what the call writes is written when it ends.
local function created(key) RECORDS[key] = {f = {}, dirty = {}, known = {}, all = true} end

local function bumps_of(key)
  local b = BUMPS[key]
  if not b then
    b = {order = {}, by = {}, float = {}, toward = {}}
    BUMPS[key] = b
  end
  return b
end

-- Adds `amount` to a counter field of `key` when the call ends (`float`: HINCRBYFLOAT's kind).
local function bump(key, field, amount, float)
  local b = bumps_of(key)
  if not b.by[field] then
    b.order[#b.order + 1] = field
    b.by[field] = 0
  end
  b.by[field] = b.by[field] + tonumber(amount)
  if float then b.float[field] = true end
end

-- Moves a figure of `key` a `1/n`th of the way from its value towards `sample` when the call ends
-- (an exponentially weighted average; an absent figure becomes the sample), kept whole: read and
-- written with the call's counters of that hash, in the same HMGET and HSET.
local function toward(key, field, sample, n)
  local b = bumps_of(key)
  if not (b.by[field] or b.toward[field]) then b.order[#b.order + 1] = field end
  b.toward[field] = {tonumber(sample), n}
end

-- The new value of a counter or average of `b` whose value before is `old` (a string or false).
local function bumped(b, field, old)
  local t = b.toward[field]
  if t then
    old = tonumber(old or '')
    return math.floor(old and (old + (t[1] - old) / t[2]) or t[1])
  end
  return tonumber(old or '0') + b.by[field]
end

-- Writes a hash's copy and counters: the changed fields of the copy (`r`, may be nil) and each
-- counter's new value in one HSET, reading (one HMGET) only the counters' values the call has not
-- read; a lone counter of a hash the call neither read nor wrote is one HINCRBY(FLOAT).
local function save(key, r, b)
  local args = {}
  if b then
    local unread = {}
    for _, field in ipairs(b.order) do
      if not (r and (r.all or r.known[field])) then unread[#unread + 1] = field end
    end
    local field = b.order[1]
    if #b.order == 1 and #unread == 1 and not b.toward[field] and not (r and next(r.dirty)) then
      redis.call(b.float[field] and 'HINCRBYFLOAT' or 'HINCRBY', key, field, redis_text(b.by[field]))
      return
    end
    local old = {}
    if #unread > 0 then
      local values = redis.call('HMGET', key, unpack(unread))
      for i, name in ipairs(unread) do old[name] = values[i] or false end
    end
    for _, name in ipairs(b.order) do
      local before = old[name]
      if before == nil then before = (r and r.f[name]) or false end
      args[#args + 1] = name
      args[#args + 1] = redis_text(bumped(b, name, before))
      if r then r.dirty[name] = nil end
    end
  end
  if r then
    for name in pairs(r.rewrite and r.f or r.dirty) do
      if not (b and (b.by[name] or b.toward[name])) then
        args[#args + 1] = name
        args[#args + 1] = r.f[name]
      end
    end
  end
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
end

local function save_records()
  for key, r in pairs(RECORDS) do save(key, r, BUMPS[key]) end
  for key, b in pairs(BUMPS) do
    if not RECORDS[key] then save(key, nil, b) end
  end
  RECORDS, BUMPS = {}, {}
end
