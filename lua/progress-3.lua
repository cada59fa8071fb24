-- progress: records one progress point of a running attempt, at most once.
--
-- Guarantees: a point is written only while the job is `running` under the caller's
-- attempt number and operation id (a late message of an earlier attempt is dropped), and
-- only when its value exceeds the highest one recorded for that node in that attempt, so a
-- replayed or reconnected websocket records nothing twice. Its seq comes from the job's
-- `event_seq`, the counter state events take theirs from, so both share one order. The
-- list keeps the last `keep` points (state events are in their own list, all kept). The
-- marks describe the current attempt only: they are cleared when the attempt changes.
--
-- KEYS[1] job record (hash)
-- KEYS[2] job's progress list
-- KEYS[3] job's progress marks (hash: `attempt`, `node:<id>` -> highest value recorded)
--
-- ARGV[1] attempt number         ARGV[5] max (a finite number)
-- ARGV[2] operation id           ARGV[6] points kept (at least 1)
-- ARGV[3] node id                ARGV[7] now (ms; '' = Redis's clock)
-- ARGV[4] value (a finite number)
--
-- Returns {1 CREATED, seq} | {0 OK} (dropped: nothing written)

local f = hmget(KEYS[1], 'state', 'attempt_count', 'operation_id')
if f[1] ~= 'running' or f[2] ~= ARGV[1] or f[3] ~= ARGV[2] then return {0} end

local value = tonumber(ARGV[4])
local field = 'node:' .. ARGV[3]
local marks = redis.call('HMGET', KEYS[3], 'attempt', field)
if marks[1] ~= ARGV[1] then  -- a new attempt's first point: the marks start again
  if marks[1] then redis.call('DEL', KEYS[3]) end
  redis.call('HSET', KEYS[3], 'attempt', ARGV[1], field, ARGV[4])
elseif marks[2] and value <= tonumber(marks[2]) then
  return {0}
else
  redis.call('HSET', KEYS[3], field, ARGV[4])
end

local seq = hincrby(KEYS[1], 'event_seq', 1)
local points = redis.call('RPUSH', KEYS[2], cjson.encode({
  seq = seq, at = clock(ARGV[7]), type = 'progress', attempt = tonumber(ARGV[1]),
  node = ARGV[3], value = value, max = tonumber(ARGV[5])}))
if points > tonumber(ARGV[6]) then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[6]), -1) end
return {1, seq}
