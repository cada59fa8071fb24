-- adjust: books a signed amount against a job (or one of its attempts) under a booking id, once.
--
-- Guarantees: a booking id is booked once per tenant, for as long as the job it was booked against is
-- kept (lua/purge.lua removes it with the job): the same id again answers what it
-- booked the first time (REPLAYED) and changes nothing; the same id with another job, attempt or
-- amount is refused (FINGERPRINT_MISMATCH) and changes nothing. An adjustment is final: its units go
-- straight to the tenant's `settled` (and the shard's `ledger:settled`), so
-- allowance = available + reserved + uncertain + settled still holds; a charge may take the
-- tenant's available units below zero (admission then refuses with 402 until the allowance is
-- raised or a credit books it back), a credit never takes the job's total below zero (INFEASIBLE):
-- its total is what it was booked for good (settled + charged + adjusted), never an uncertain hold,
-- which goes back to the reservation when the run provably never happened.
-- It may come at any state of the job, after settlement and after the job was packed: the record
-- (live or packed, lua/_cache.lua reads through either) gains `adjusted` (the job's sum) and an entry
-- in `adjustments` (a JSON array of {id, units, attempt, reason, at}), both plain fields beside `z`.
--
-- keys: 7
-- KEYS[1] job record (hash)
-- KEYS[2] tenant ledger (hash)
-- KEYS[3] tenant's bookings (hash): booking id -> JSON {job, attempt, units, reason, at}
-- KEYS[4] tenant's booking log (zset): booking id -> when it was booked (ms)
--
-- KEYS[5] global stats (hash), KEYS[6] queue (zset), KEYS[7] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] now (ms; '' = Redis's clock)
-- ARGV[2] booking id
-- ARGV[3] units (signed integer; positive: a charge, negative: a credit)
-- ARGV[4] attempt number (0: the whole job)
-- ARGV[5] reason (text)
--
-- Returns {0 OK, units, at} | {2 REPLAYED, units, at}
--   | {4 FINGERPRINT_MISMATCH, job, attempt, units} (the id booked something else)
--   | {7 NOT_FOUND, what} (what: job | attempt) | {18 INFEASIBLE, booked} (a credit past what the job was booked for good)

use_globals(5)
local job, now, id = KEYS[1], clock(ARGV[1]), ARGV[2]
local units, attempt = tonumber(ARGV[3]), tonumber(ARGV[4])
local job_id = string.match(job, ':job:(.*)$')
local earlier = redis.call('HGET', KEYS[3], id)
if earlier then
  local e = cjson.decode(earlier)
  if e.job == job_id and e.units == units and e.attempt == attempt then return {2, e.units, e.at} end
  return {4, e.job, e.attempt, e.units}
end
local f = hmget(job, 'state', 'attempt_count', 'settled', 'charged', 'adjusted')
if not f[1] then return {7, 'job'} end
if attempt > tonumber(f[2] or '0') then return {7, 'attempt'} end
local booked = 0
for i = 3, 5 do booked = booked + tonumber(f[i] or '0') end
if booked + units < 0 then return {18, booked} end
hincrby(job, 'adjusted', units)
local reason = ARGV[5]
-- cjson writes a number with 14 significant digits (1234567890123456 as 1.2345678901235e+15): the units go
-- in as 0 and are written back exactly ('"units":0' cannot occur inside an encoded string: its quotes are escaped)
local function exact(fields)
  return (string.gsub(cjson.encode(fields), '"units":0', '"units":' .. string.format('%d', units), 1))
end
local entry = exact({id = id, units = 0, attempt = attempt, reason = reason, at = now})
local before = hget(job, 'adjustments')
hset(job, 'adjustments', before and (string.sub(before, 1, -2) .. ',' .. entry .. ']') or ('[' .. entry .. ']'))
ledger_add(KEYS[2], 'settled', units)
redis.call('HSET', KEYS[3], id, exact({job = job_id, attempt = attempt, units = 0, reason = reason, at = now}))
redis.call('ZADD', KEYS[4], now, id)
return {0, units, now}
