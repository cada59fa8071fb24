-- A finished job in one compact field: `z` of its record, beside its plain `state` (what redis-cli
-- and every script look at first). pipeline/state/archive.py reads the same form; the key lists below are
-- in step with its own (a test compares them). `z` is JSON:
--
--   [2, created_at, [record values], {other fields}, [attempts], [events], [outputs]]
--
-- Record values come in RECORD_FIELDS order: null where the record has no such field (the nulls at
-- the end left out), true for `id` and `tenant` when the key names them already. Attempts, events and
-- outputs are arrays of their values, when the item's keys are ATTEMPT_KEYS, EVENT_KEYS or OUTPUT_KEYS
-- in that order (how the scripts write them), or an attempt's keys are ATTEMPT_TIMED_KEYS in any order; any other item is kept as the object it was stored as,
-- keys in their order. An integer is a JSON number; a moment (the *_TIMES) counts from created_at, so
-- most are a few digits (the deadline from created_at + deadline_s seconds: `record_number`); a string
-- is written with its slashes as they are (cjson writes `\/`). An event whose `from` is the `to` of the
-- event before it (null for the first) leaves it out (4 values), and then its `reason` too when that is
-- its `to` (3); an output of the content type of the output before it leaves it out (3 values after its
-- index); an output's sha256 of 64 hex digits is `=` and 43 characters (`digest_text`). Version 1
-- (every null, every `from` and type, digests in hex, `\/`) is read as it was written.
-- About a third of the bytes of the record with its parts as JSON objects (docs/operations.md "Bounded memory and retention").

local PACKED, PACK_VERSION = 'z', 2
local RECORD_FIELDS = {'id', 'tenant', 'idem_key', 'kind', 'priority', 'outputs_requested', 'price', 'per_attempt',
  'ceiling', 'attempts_allowed', 'attempt_count', 'attempts_not_sent', 'reserved', 'charged', 'uncertain', 'settled',
  'seq', 'supersedes', 'event_seq', 'submitted', 'lease_gen', 'deadline_s', 'deadline', 'updated_at', 'settled_at',
  'error_class', 'error_reason', 'error_detail', 'cancel_requested', 'obsolete', 'external_effect'}
local RECORD_TIMES = {deadline = true, updated_at = true, settled_at = true}
local ATTEMPT_KEYS = {'number', 'submitted_at', 'price', 'worker', 'state', 'error_class', 'started_at', 'generation',
  'provider', 'ended_at', 'operation_id', 'server'}
-- An attempt a per-second price booked also has `seconds_ms` (end_attempt adds it, and cjson puts it where
-- its table's layout falls): packed as these 13 values, whatever the order of its stored keys.
local ATTEMPT_TIMED_KEYS = {'number', 'submitted_at', 'price', 'worker', 'state', 'error_class', 'started_at',
  'generation', 'provider', 'ended_at', 'operation_id', 'server', 'seconds_ms'}
local EVENT_KEYS = {'at', 'to', 'from', 'seq', 'reason'}
local OUTPUT_KEYS = {'sha256', 'bytes', 'content_type'}
local ITEM_TIMES = {at = true, started_at = true, submitted_at = true, ended_at = true}

-- Fields a packed record's `z` never carries: its plain ones, and those `created_at` stands for.
local NOT_PACKED = {state = true, z = true, created_at = true}

local function is_integer(value)
  return type(value) == 'number' and value == math.floor(value) and math.abs(value) < 2^53
end

-- The tenant a job id names (`<tenant>.<hex>`: pipeline/state/keys.py `tenant_of`).
local function tenant_of(job_id)
  return string.match(job_id, '^(.*)%.[^.]*$')
end

-- A Redis string that reads back as the same integer (no sign, zeros or spaces it would lose).
local function integer_text(text)
  return #text <= 15 and (string.match(text, '^-?[1-9]%d*$') or text == '0') and tonumber(text) or nil
end

-- A value as cjson writes it, its slashes unescaped (cjson writes `\/`; a `\` in its text always
-- opens a two-character escape, so the `\/` it finds are its escaped slashes).
local function json_text(value)
  return (string.gsub(cjson.encode(value), '\\/', '/'))
end

-- One decoded JSON value, as compact JSON (a moment relative to `base`).
local function encode_value(value, base, moment)
  if value == cjson.null then return 'null' end
  if is_integer(value) then return string.format('%d', moment and value - base or value) end
  if type(value) == 'number' then return string.format('%.17g', value) end
  return json_text(value)
end

-- 64 hex digits as `=` and 43 characters of DIGITS, each pair the value of three hex digits, the last
-- the value of the last one (pipeline/state/archive.py `_digest` reads it).
local DIGITS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
local function digest_text(hex)
  local out = {'='}
  for i = 1, 61, 3 do
    local v = tonumber(string.sub(hex, i, i + 2), 16)
    local high, low = math.floor(v / 64) + 1, v % 64 + 1
    out[#out + 1] = string.sub(DIGITS, high, high) .. string.sub(DIGITS, low, low)
  end
  local last = tonumber(string.sub(hex, 64, 64), 16) + 1
  out[#out + 1] = string.sub(DIGITS, last, last)
  return table.concat(out)
end

-- The keys of a flat JSON object, in the order its text has them (a key inside a string value is
-- escaped, \", so only the object's own keys follow a `{` or `,` directly).
local function key_order(raw)
  local order = {}
  for name in string.gmatch(raw, '[{,]"([%w_]+)":') do order[#order + 1] = name end
  return order
end

-- Whether a stored JSON text may hold a number that Lua's numbers would not write back as it was:
-- one with a fraction or an exponent (2.0 would come back as 2), or of 16 digits or more (past 2^53).
-- It may also match inside a string value: such an item is only kept as its text, never altered.
local function odd_numbers(raw)
  return string.find(raw, ':%-?%d+[%.eE]') or string.find(raw, ':%-?' .. string.rep('%d', 16))
end

-- One stored JSON object (its text) as the array of its values, when its keys are `names` in that
-- order and its values are strings, null, booleans or integers below 2^53; else its text as it is
-- (an object: a reader gets its keys and values as they were).
-- Also answers the decoded item when it became an array (nil when it is kept as its text).
local function encode_item(raw, names, base, any_order)
  local order = key_order(raw)
  if #order ~= #names or odd_numbers(raw) then return raw end
  local stored = {}
  for i, name in ipairs(order) do stored[name] = any_order or i end
  for i, name in ipairs(names) do
    if stored[name] ~= (any_order or i) then return raw end
  end
  local item, out = cjson.decode(raw), {}
  for i, name in ipairs(names) do
    local value = item[name]
    if type(value) == 'table' then return raw end  -- an array or object: [] would come back as {}
    if name == 'sha256' and type(value) == 'string' then
      if string.match(value, '^' .. string.rep('[0-9a-f]', 64) .. '$') then
        out[i] = '"' .. digest_text(value) .. '"'
      elseif string.sub(value, 1, 1) == '=' then
        return raw  -- it would read as a digest
      end
    end
    out[i] = out[i] or encode_value(value, base, ITEM_TIMES[name])
  end
  return '[' .. table.concat(out, ',') .. ']', item
end

local function encode_items(items, names, base)
  local out = {}
  for i, raw in ipairs(items) do out[i] = encode_item(raw, names, base) end
  return '[' .. table.concat(out, ',') .. ']'
end

-- Attempts: ATTEMPT_KEYS' values in order, or ATTEMPT_TIMED_KEYS' (in any order stored), else the text.
local function encode_attempts(items, base)
  local out = {}
  for i, raw in ipairs(items) do
    out[i] = encode_item(raw, ATTEMPT_KEYS, base)
    if out[i] == raw then out[i] = encode_item(raw, ATTEMPT_TIMED_KEYS, base, true) end
  end
  return '[' .. table.concat(out, ',') .. ']'
end

-- Events, each without its `from` when that is the `to` of the one before (a string; null for the first),
-- and then without its `reason` too when that is its `to` (a string).
local function encode_events(events, base)
  local out, before = {}, cjson.null
  for i, raw in ipairs(events) do
    local text, item = encode_item(raw, EVENT_KEYS, base)
    if item and item.from == before and (before == cjson.null or type(before) == 'string') then
      local reason = ''
      if not (type(item.to) == 'string' and item.reason == item.to) then reason = ',' .. encode_value(item.reason, base) end
      text = '[' .. encode_value(item.at, base, true) .. ',' .. encode_value(item.to, base) .. ','
        .. encode_value(item.seq, base) .. reason .. ']'
    end
    out[i] = text
    before = item and item.to or false  -- false: never a `from`
  end
  return '[' .. table.concat(out, ',') .. ']'
end

-- A record value that is an integer, as packed: a moment counted from `base` (created_at), the deadline
-- from `base` + deadline_s seconds when deadline_s is an integer below 10^9 (0 for most jobs; a larger one
-- would pass 2^53 in milliseconds).
local function record_number(name, n, base, fields)
  local window = name == 'deadline' and integer_text(fields.deadline_s or '')
  if window and math.abs(window) < 1e9 then return n - base - window * 1000 end
  return RECORD_TIMES[name] and n - base or n
end

-- `z` for the job `job_id` with record `fields` (field -> Redis string; `state` and LIVE fields
-- left out by the caller) and its parts, each a list of stored JSON texts (outputs: {index, raw}).
local function pack_value(job_id, fields, attempts, events, outputs)
  local base = integer_text(fields.created_at or '') or 0
  local tenant = tenant_of(job_id)
  local values, listed = {}, {}
  for i, name in ipairs(RECORD_FIELDS) do
    local text = fields[name]
    listed[name] = true
    if text == nil or text == false then
      values[i] = 'null'
    elseif (name == 'id' and text == job_id) or (name == 'tenant' and text == tenant) then
      values[i] = 'true'
    else
      local n = integer_text(text)
      values[i] = n and string.format('%d', record_number(name, n, base, fields)) or json_text(text)
    end
  end
  while values[#values] == 'null' do values[#values] = nil end
  local rest = {}
  for name, text in pairs(fields) do
    if not listed[name] and not NOT_PACKED[name] then rest[#rest + 1] = json_text(name) .. ':' .. json_text(text) end
  end
  table.sort(rest)
  local created = fields.created_at
  created = (created == nil and 'null') or (integer_text(created) and created) or json_text(created)
  local o, before = {}, false  -- before: the content type of the output before, when it was an array
  for i, output in ipairs(outputs) do
    local index = string.format('%d', output.index)
    local encoded, item = encode_item(output.raw, OUTPUT_KEYS, base)
    local kind = item and item.content_type
    if type(kind) == 'string' and kind == before then  -- the same content type: left out
      encoded = string.sub(encoded, 1, #encoded - #json_text(kind) - 2) .. ']'
    end
    before = type(kind) == 'string' and kind
    if string.sub(encoded, 1, 1) == '[' then
      o[i] = '[' .. index .. ',' .. string.sub(encoded, 2)
    else  -- kept as its object
      o[i] = '[' .. index .. ',' .. encoded .. ']'
    end
  end
  return '[' .. PACK_VERSION .. ',' .. created .. ',[' .. table.concat(values, ',') .. '],{' .. table.concat(rest, ',')
    .. '},' .. encode_attempts(attempts, base) .. ',' .. encode_events(events, base) .. ',['
    .. table.concat(o, ',') .. ']]'
end

-- The record fields a packed value holds (field -> Redis string), `id`, `tenant` and `created_at` included.
packed_fields = function(key, raw)
  local z = cjson.decode(raw)
  local job_id = string.match(key, ':job:(.*)$')
  local created = z[2]
  local base = is_integer(created) and created or 0
  local fields = {created_at = created ~= cjson.null and redis_text(created) or nil}
  local window = 0  -- what the deadline is counted from, past created_at (version 2)
  for i, name in ipairs(RECORD_FIELDS) do
    if z[1] >= 2 and name == 'deadline_s' and is_integer(z[3][i]) and math.abs(z[3][i]) < 1e9 then
      window = z[3][i] * 1000
    end
  end
  for i, name in ipairs(RECORD_FIELDS) do
    local value = z[3][i]
    if value == true then
      fields[name] = name == 'id' and job_id or tenant_of(job_id)
    elseif value ~= cjson.null and value ~= nil then
      if name == 'deadline' and is_integer(value) then value = value + window end
      fields[name] = redis_text(RECORD_TIMES[name] and is_integer(value) and value + base or value)
    end
  end
  for name, text in pairs(z[4]) do fields[name] = text end
  return fields
end
