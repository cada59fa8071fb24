-- progress: records one progress point of a running attempt, at most once.
--
-- Guarantees: a point is written only while the job is `running` under the caller's
-- attempt number and operation id (a late message of an earlier attempt is dropped), and
-- only when its value exceeds the highest one recorded for that node in that attempt, so a
-- replayed or reconnected websocket records nothing twice. Its seq comes from the job's
-- `event_seq`, the counter state events take theirs from, so both share one order. The
-- list keeps the last `keep` points (state events are in their own list, all kept). The
-- marks are fields of the record, `pm:<attempt>:<node>` -> highest value recorded, read with the
-- record's fields and written with its `event_seq`; another attempt's marks are never read, and
-- a job packed when it ends drops them all (`pack_finished` in _lib.lua).
--
-- Cost: a point recorded is 5 commands besides the FCALL (HMGET of the record, TIME, RPUSH, one
-- HSET of the record, XADD to the shard's stream of changes), 6 when the list is full (LTRIM), and one
-- RPUSH more to the webhook outbox when the tenant asked for `job.progress`; a point dropped is 1.
--
-- keys: 2
-- KEYS[1] job record (hash)
-- KEYS[2] job's progress list
--
-- ARGV[1] attempt number         ARGV[5] max (a finite number)
-- ARGV[2] operation id           ARGV[6] points kept (at least 1)
-- ARGV[3] node id                ARGV[7] now (ms; '' = Redis's clock)
-- ARGV[4] value (a finite number)
--
-- Returns {1 CREATED, seq} | {0 OK} (dropped: nothing written)

local mark = 'pm:' .. ARGV[1] .. ':' .. ARGV[3]
preload(KEYS[1], {'state', 'attempt_count', 'operation_id', 'event_seq', mark, 'hooks', 'id', 'tenant'})  -- one HMGET
local f = hmget(KEYS[1], 'state', 'attempt_count', 'operation_id', mark)
if f[1] ~= 'running' or f[2] ~= ARGV[1] or f[3] ~= ARGV[2] then return {0} end

local value = tonumber(ARGV[4])
if f[4] and value <= tonumber(f[4]) then return {0} end
hset(KEYS[1], mark, ARGV[4])

local seq = hincrby(KEYS[1], 'event_seq', 1)
local point = {seq = seq, at = clock(ARGV[7]), type = 'progress', attempt = tonumber(ARGV[1]),
  node = ARGV[3], value = value, max = tonumber(ARGV[5])}
local raw = cjson.encode(point)
local kept = redis.call('RPUSH', KEYS[2], raw)
changed(KEYS[1], point)  -- the stream of changes, when the call ends
hook_event(KEYS[1], 'job.progress', point)  -- when the tenant asked for progress webhooks
if kept > tonumber(ARGV[6]) then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[6]), -1) end
return {1, seq}
