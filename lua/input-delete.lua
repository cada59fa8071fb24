-- input-delete: removes one of a tenant's inputs once no unfinished job uses it, exactly: every job
-- admitted naming it is in its set of jobs (lua/admit.lua adds it in the step that creates the job),
-- and this step looks at the state of each one. Finished (or purged) jobs leave the set here (and in
-- lua/input-prune.lua), never when a job ends: a job's end costs nothing. The caller read the set's members and
-- passes each one's record; a member it did not pass (a job admitted since) answers NOT_CLAIMABLE and
-- the caller reads again. Its bytes stay in the blob store for `reckon blobs gc` (another tenant, or
-- an output, may hold the same bytes).
--
-- For the retention pass (ARGV[5] not ''): only an input no job named, nor upload repeated, since
-- ARGV[5]; one an unfinished job still uses is looked at again from ARGV[6] on.
--
-- keys: 3 or more
-- KEYS[1] tenant's inputs (hash: sha256 -> JSON input; `total` -> their bytes)
-- KEYS[2] shard's inputs by last use (zset: `<tenant>/<sha256>` -> ms)
-- KEYS[3] the input's jobs (set of job ids)
-- then one key per job id the caller read in KEYS[3]: its record (hash)
--
-- ARGV[1] the tenant   ARGV[2] sha256 (hex)   ARGV[3] number of job ids given
-- ARGV[4] the job ids, comma-separated
-- ARGV[5] '' to delete now; for expiry, the time (ms) it must not have been used since
-- ARGV[6] for expiry, when to look again at an input still in use (ms)
--
-- Returns {0 OK, input (JSON)} | {7 NOT_FOUND} | {11 NOT_DUE} (used since ARGV[5])
--   | {8 NOT_CLAIMABLE} (the set has a job the caller did not read) | {23 IN_USE, job id, ...}

local UNFINISHED = {queued = true, running = true, retry_wait = true, reconciling = true, needs_review = true}
local sha, member, n = ARGV[2], ARGV[1] .. '/' .. ARGV[2], tonumber(ARGV[3])
local input = redis.call('HGET', KEYS[1], sha)
if not input then
  redis.call('ZREM', KEYS[2], member)  -- an entry left of an input gone: never looked at again
  return {7}
end
if ARGV[5] ~= '' then
  local used = redis.call('ZSCORE', KEYS[2], member)
  if used and tonumber(used) > tonumber(ARGV[5]) then return {11} end
end
local given, ids = {}, {}
for id in string.gmatch(ARGV[4], '[^,]+') do
  ids[#ids + 1] = id
  given[id] = #ids + 3
end
if #ids ~= n then return redis.error_reply('input-delete: ARGV[3] says ' .. n .. ' job ids, ARGV[4] has ' .. #ids) end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if not given[id] then return {8} end
end
local busy = {}
for i, id in ipairs(ids) do
  if UNFINISHED[redis.call('HGET', KEYS[3 + i], 'state') or ''] then
    busy[#busy + 1] = id
  else
    redis.call('SREM', KEYS[3], id)
  end
end
if #busy > 0 then
  if ARGV[5] ~= '' then redis.call('ZADD', KEYS[2], tonumber(ARGV[6]), member) end
  return {23, unpack(busy)}
end
redis.call('HDEL', KEYS[1], sha)
redis.call('HINCRBY', KEYS[1], 'total', -cjson.decode(input).bytes)
redis.call('ZREM', KEYS[2], member)
redis.call('DEL', KEYS[3])
return {0, input}
