-- Idempotency records (prepended to every script with the other helpers: pipeline/state/scripts.py),
-- written by lua/admit.lua and lua/confirm-publish.lua.

-- An idempotency record is the field of its Idempotency-Key in a hash of its tenant's records admitted in
-- one window of the idempotency TTL (`<tenant>:idems:<seconds since the epoch // TTL>`), the hash expiring
-- IDEM_KEEP TTLs after its last write, so a finished job has no key of its own for it. The field's value:
-- state `p` (pending) until the job's message is in the broker, then `d` (done); the first response's
-- status; the first IDEM_PRINT hex digits of the request's fingerprint (60 bits: a different body under
-- the same key is told apart but for a chance in 2^60); the job id past its tenant (the key names the
-- tenant), both as IDEM_DIGITS, two for three hex digits and one for a last one or two (`idem_digits`):
-- `d202` + 10 + 14 characters; then a space and when it expires (s, Redis's clock):
-- `d202kaeQZ8VrmSa_7Zn52HglBZLM 1796626492` (39 bytes: 48 with its header in a hash table). A fingerprint
-- or job id not of lowercase hex digits (15 and 20) is written `<state><status> <fingerprint digits> <job>`
-- (the job `=<job id>` when it is not `<tenant>.<hex>`). The caller passes IDEM_WINDOWS windows around its
-- own clock; Redis's picks the current one and the one before (`idem_windows`), so hosts whose clocks
-- differ by less than a TTL find each other's records, and a record answers until its own expiry.
-- `idem_find` answers {fingerprint, job id, state, status, hash, window, expires}, or nil; a record an
-- earlier version wrote as its own key (`d202 <16 hex> <20 hex>` or `d202<24 digits>`, the spelt-out
-- `<state> <status> <fingerprint> <job id>`, or a hash of fields of those names) is read as it is until it
-- expires (`hash` true for the hash, `window` nil). `idem_matches` compares a fingerprint with the digits
-- a record kept.
local IDEM_PRINT = 15
local IDEM_WINDOWS, IDEM_KEEP = 4, 2
local IDEM_JOB = 20  -- hex digits of a job id past its tenant (pipeline/state/keys.py `new_job_id`)
local IDEM_DIGITS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

-- Hex digits as IDEM_DIGITS: each three as two (their value's high and low six bits), each of the one
-- or two left over as one; `idem_hex` reads `n` hex digits back.
local function idem_digits(hex)
  local out, i = {}, 1
  while i <= #hex do
    local width = (#hex - i >= 2) and 3 or 1
    local v = tonumber(string.sub(hex, i, i + width - 1), 16)
    if width == 3 then
      local high, low = math.floor(v / 64) + 1, v % 64 + 1
      out[#out + 1] = string.sub(IDEM_DIGITS, high, high) .. string.sub(IDEM_DIGITS, low, low)
    else
      out[#out + 1] = string.sub(IDEM_DIGITS, v + 1, v + 1)
    end
    i = i + width
  end
  return table.concat(out)
end

local function idem_hex(text, n)
  local out, at = {}, 1
  for _ = 1, math.floor(n / 3) do
    local high = string.find(IDEM_DIGITS, string.sub(text, at, at), 1, true) - 1
    local low = string.find(IDEM_DIGITS, string.sub(text, at + 1, at + 1), 1, true) - 1
    out[#out + 1] = string.format('%03x', high * 64 + low)
    at = at + 2
  end
  for _ = 1, n % 3 do
    out[#out + 1] = string.format('%x', string.find(IDEM_DIGITS, string.sub(text, at, at), 1, true) - 1)
    at = at + 1
  end
  return table.concat(out)
end

local IDEM_STATES = {p = 'pending', d = 'done'}

-- A record's text (without its expiry) as idem_find answers it; `tenant` is the one its key names.
local function idem_parse(raw, tenant)
  local state, status, digits = string.match(raw, '^([pd])(%d%d%d)([%w%-_]+)$')
  if state and #digits == 24 then  -- the compact form: 10 digits of the fingerprint, 14 of the job
    local job_id = tenant .. '.' .. idem_hex(string.sub(digits, 11), IDEM_JOB)
    return {idem_hex(string.sub(digits, 1, 10), IDEM_PRINT), job_id, IDEM_STATES[state], status, false}
  end
  local fingerprint, job
  state, status, fingerprint, job = string.match(raw, '^(%a)(%d+) (%S+) (%S+)$')
  if state then
    if string.sub(job, 1, 1) ~= '=' then job = tenant .. '.' .. job end
    return {fingerprint, (string.gsub(job, '^=', '')), IDEM_STATES[state], status, false}
  end
  local job_id
  state, status, fingerprint, job_id = string.match(raw, '^(%S+) (%S+) (%S+) (.+)$')
  return {fingerprint, job_id, state, status, false}
end

-- A record an earlier version wrote as its own key (a string, or a hash of its fields).
local function idem_read(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    local f = redis.call('HMGET', key, 'fingerprint', 'job_id', 'state', 'status')
    return f[1] and {f[1], f[2], f[3], f[4], true} or nil
  end
  if not raw then return nil end
  return idem_parse(raw, string.match(key, '}:t:([%w_]+):idem:') or '')
end

-- The current window's key and the one before it by `now` (ms): `windows` are IDEM_WINDOWS keys, the
-- first of window `first`, each the next; `ttl` the window's length (s).
local function idem_windows(windows, first, ttl, now)
  local at = math.floor(now / 1000 / ttl) - tonumber(first) + 1
  at = math.max(2, math.min(IDEM_WINDOWS, at))  -- a caller's clock a TTL or more away: its own window
  return windows[at], windows[at - 1]
end

-- The unexpired record of `field` in the current window or the one before, else the one an earlier version
-- wrote at `legacy`; nil when there is none.
-- With `now` nil (a caller that reads no clock), the first record found in the caller's window, the one
-- before it or the one after, whether or not it still answers.
local function idem_find(windows, first, ttl, now, field, legacy)
  local current, before = windows[3], windows[2]
  if now then current, before = idem_windows(windows, first, ttl, now) end
  for _, key in ipairs({current, before, not now and windows[4] or nil}) do
    local raw = redis.call('HGET', key, field)
    local text, expires = string.match(raw or '', '^(.*) (%d+)$')
    if text and (not now or tonumber(expires) * 1000 > now) then
      local seen = idem_parse(text, string.match(key, '}:t:([%w_]+):idems:') or '')
      seen[6], seen[7] = key, expires
      return seen
    end
  end
  return idem_read(legacy)
end

-- Writes `field`'s record in the current window, expiring `ttl` seconds from `now` (ms).
local function idem_write(windows, first, ttl, now, field, text)
  local current = idem_windows(windows, first, ttl, now)
  redis.call('HSET', current, field, text .. ' ' .. (math.floor(now / 1000) + ttl))
  redis.call('EXPIRE', current, IDEM_KEEP * ttl)
end

local function idem_matches(seen, fingerprint)
  return string.sub(fingerprint, 1, #seen[1]) == seen[1]
end

-- A job id is `<tenant>.<hex>` (pipeline/state/keys.py): the record keeps the hex; any other id whole,
-- after `=`. The compact form when both are lowercase hex of the lengths it holds.
local function idem_text(state, status, fingerprint, job_id)
  local digits, hex = string.sub(fingerprint, 1, IDEM_PRINT), string.match(job_id, '^[%w_]+%.(%x+)$')
  local head = string.sub(state, 1, 1) .. status
  if string.match(digits, '^' .. string.rep('[0-9a-f]', IDEM_PRINT) .. '$') and hex
      and string.match(hex, '^' .. string.rep('[0-9a-f]', IDEM_JOB) .. '$') and string.match(status, '^%d%d%d$') then
    return head .. idem_digits(digits) .. idem_digits(hex)
  end
  return head .. ' ' .. digits .. ' ' .. (hex or ('=' .. job_id))
end
