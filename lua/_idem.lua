-- Idempotency records (prepended to every script with the other helpers: pipeline/state/scripts.py),
-- written by lua/admit.lua and lua/confirm-publish.lua.

-- An idempotency record is one string, `<state><status> <fingerprint> <job>`, written with its expiry in
-- one SET: state `p` (pending) until the job's message is in the broker, then `d` (done); the first
-- response's status; the first IDEM_PRINT hex digits of the request's fingerprint (64 bits: a different
-- body under the same key is told apart but for a chance in 2^64); the job id past its tenant (the
-- key names the tenant). `d202 91a79067c56b9923 6bfed99f9d87825059bc` is 42 bytes: Redis keeps a
-- string of up to 44 in one allocation with its header (64 bytes), where the record spelt out took 128.
-- `idem_read` answers {fingerprint, job id, state, status, hash}, or nil when there is none; a record an
-- earlier version wrote (`<state> <status> <fingerprint> <job id>`, or a hash of fields of those names)
-- is read as it is until it expires (`hash` true for the hash). `idem_matches` compares a fingerprint
-- with the digits a record kept.
local IDEM_PRINT = 16
local IDEM_STATES = {p = 'pending', d = 'done'}

local function idem_read(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    local f = redis.call('HMGET', key, 'fingerprint', 'job_id', 'state', 'status')
    return f[1] and {f[1], f[2], f[3], f[4], true} or nil
  end
  if not raw then return nil end
  local state, status, fingerprint, job = string.match(raw, '^(%a)(%d+) (%S+) (%S+)$')
  if state then
    if string.sub(job, 1, 1) ~= '=' then job = string.match(key, '}:t:([%w_]+):idem:') .. '.' .. job end
    return {fingerprint, (string.gsub(job, '^=', '')), IDEM_STATES[state], status, false}
  end
  local job_id
  state, status, fingerprint, job_id = string.match(raw, '^(%S+) (%S+) (%S+) (.+)$')
  return {fingerprint, job_id, state, status, false}
end

local function idem_matches(seen, fingerprint)
  return string.sub(fingerprint, 1, #seen[1]) == seen[1]
end

-- A job id is `<tenant>.<hex>` (pipeline/state/keys.py): the record keeps the hex; any other id whole,
-- after `=`.
local function idem_text(state, status, fingerprint, job_id)
  local job = string.match(job_id, '^[%w_]+%.(%x+)$') or ('=' .. job_id)
  return string.sub(state, 1, 1) .. status .. ' ' .. string.sub(fingerprint, 1, IDEM_PRINT) .. ' ' .. job
end
