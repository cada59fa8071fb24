-- workflow-save: saves the next version of a named workflow for one owner (every tenant, or one tenant).
-- A version is written once and never changed: version n + 1 goes to a field that cannot exist yet, and
-- `<owner>:latest` moves to it in the same step. Saving what the latest version holds already saves
-- nothing and answers that version (a retried save makes no second version). A name is either shared (saved for every tenant) or
-- tenants' own, never both, so a reference means one thing to each tenant (docs/api.md "Saved workflows").
--
-- keys: 2
-- KEYS[1] the name's workflow (hash: `kind` shared | tenant; `<owner>:latest` -> n; `<owner>:<n>` -> JSON version;
--   `<owner>:digest` -> ARGV[5] of the latest)
-- KEYS[2] the names of saved workflows (set)
--
-- ARGV[1] the owner: '*' for every tenant, or a tenant   ARGV[2] the name
-- ARGV[3] the version's JSON object (graph, params, needs), without its number and time
-- ARGV[4] most versions an owner keeps of one name   ARGV[5] sha256 of ARGV[3] (hex)
--
-- Returns {0 OK, version, saved_at (ms, Redis's clock)} | {2 REPLAYED, version, its JSON} (the latest holds
--   ARGV[3] already) | {23 IN_USE, kind} (the name is the other
--   kind's: nothing written) | {17 LIMITED} (the owner has ARGV[4] versions of it already)

local owner = ARGV[1]
local kind = owner == '*' and 'shared' or 'tenant'
local held = redis.call('HGET', KEYS[1], 'kind')
if held and held ~= kind then return {23, held} end
local latest = tonumber(redis.call('HGET', KEYS[1], owner .. ':latest') or '0')
if latest > 0 and redis.call('HGET', KEYS[1], owner .. ':digest') == ARGV[5] then
  return {2, latest, redis.call('HGET', KEYS[1], owner .. ':' .. latest)}
end
if latest >= tonumber(ARGV[4]) then return {17} end
local version, at = latest + 1, clock('')
local body = '{"version":' .. version .. ',"saved_at":' .. at .. ',' .. string.sub(ARGV[3], 2)
redis.call('HSET', KEYS[1], 'kind', kind, owner .. ':latest', version, owner .. ':' .. version, body,
  owner .. ':digest', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[2])
return {0, version, at}
