-- input-put: records an uploaded input of a tenant, its bytes held against the tenant's quota, as
-- one step: two uploads at once can never both pass a quota that has room for one of them, nor the
-- most inputs a tenant may keep (each costs Redis its record and the blob store a file, whatever its
-- size: the quota of bytes alone would let 9-byte inputs by the hundred million through). The
-- bytes are in the blob store before this is called (the API puts them first, durably), so a record
-- always names stored bytes. An input the tenant has already is answered as it is (only its last use
-- moves: an upload counts as a use for the retention), never counted twice.
--
-- keys: 3
-- KEYS[1] tenant's inputs (hash: sha256 -> JSON input; `total` -> their bytes)
-- KEYS[2] tenant's limits (hash: `input_quota` -> bytes, set by `reckon tenant set --input-quota`)
-- KEYS[3] shard's inputs by last use (zset: `<tenant>/<sha256>` -> ms)
--
-- ARGV[1] now (ms; '' = Redis's clock)   ARGV[2] the tenant   ARGV[3] sha256 (hex)
-- ARGV[4] name (`reckon/<sha256>.<ext>`)  ARGV[5] size (bytes)  ARGV[6] content type
-- ARGV[7] the quota when the tenant has none of its own (bytes)   ARGV[8] the most inputs a tenant keeps
--
-- Returns {1 CREATED, input (JSON)} | {2 REPLAYED, input (JSON)}
--   | {22 OVER_QUOTA, bytes the tenant keeps, its quota, inputs it keeps}

local now, sha = clock(ARGV[1]), ARGV[3]
local member = ARGV[2] .. '/' .. sha
local had = redis.call('HGET', KEYS[1], sha)
if had then
  redis.call('ZADD', KEYS[3], now, member)
  return {2, had}
end
local size = tonumber(ARGV[5])
local quota = tonumber(redis.call('HGET', KEYS[2], 'input_quota') or '') or tonumber(ARGV[7])
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
local count = math.max(0, redis.call('HLEN', KEYS[1]) - 1)  -- every field but `total`
if total + size > quota or count >= tonumber(ARGV[8]) then return {22, total, quota, count} end
local input = cjson.encode({name = ARGV[4], sha256 = sha, bytes = size, content_type = ARGV[6], created_at = now})
redis.call('HSET', KEYS[1], sha, input)
redis.call('HINCRBY', KEYS[1], 'total', size)
redis.call('ZADD', KEYS[3], now, member)
return {1, input}
