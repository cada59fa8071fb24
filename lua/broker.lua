-- broker: the dispatch script of reckon's Redis broker (pipeline/waking.py), in place of the one
-- Dramatiq ships: the same calls, keys and replies, so Dramatiq's Python side is unchanged, with
-- fewer Redis commands per message. Not part of the state library (pipeline/scripts.py loads only
-- `<verb>-<keys>.lua`): the broker registers it itself, on the broker's own Redis database.
--
-- Keys, under the namespace KEYS[1] (Dramatiq's layout):
--   <ns>:<queue>                 list of message ids waiting
--   <ns>:<queue>.msgs            hash message id -> message
--   <ns>:__acks__.<worker>.<queue>  set of ids a worker fetched and has not acked
--   <ns>:__heartbeats__          zset worker -> its last fetch (ms)
--   <ns>:<queue>.XQ(.msgs)       dead-lettered ids by when, and their messages
--
-- ARGV: command, now (ms), queue, worker id, heartbeat timeout (ms), dead message ttl (ms),
-- maintenance ('1' to run it), largest unpack, then the command's own arguments.
--
-- What differs from Dramatiq's script, and why it holds:
-- - Only a fetch writes the worker's heartbeat, not an enqueue or an ack: a process that only
--   publishes (the API, the watcher) holds no message, so it needs none; a consumer fetches at
--   least every recheck (a quarter of the heartbeat timeout) while it has room for a message, and
--   an ack gives it that room, so its heartbeat is as fresh as the acks kept it.
-- - A fetch takes its messages with one LPOP of a count and marks them with one SADD, not an
--   LPOP and an SADD per message and a last LPOP that finds the list empty.
-- Per message: enqueue 3 commands, fetch 5, ack 3 (Dramatiq's: 4, 6, 4).

local ns = KEYS[1]
local command, now, queue, worker = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local timeout, dead_ttl, maintain, max_unpack = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])

local canonical = queue
if string.sub(queue, -3) == '.DQ' then canonical = string.sub(queue, 1, -4) end
local heartbeats = ns .. ':__heartbeats__'
local worker_acks = ns .. ':__acks__.' .. worker
local acks = worker_acks .. '.' .. queue
local list = ns .. ':' .. queue
local messages = list .. '.msgs'
local dead = ns .. ':' .. canonical .. '.XQ'
local dead_messages = dead .. '.msgs'

-- Calls `fn` with the items of `ids` in slices no longer than Lua's stack allows.
local function in_slices(ids, fn)
  for first = 1, #ids, max_unpack do
    fn(unpack(ids, first, math.min(first + max_unpack - 1, #ids)))
  end
end

-- The messages of workers whose heartbeat is older than the timeout go back to this queue; a dead
-- worker with no unacked messages left anywhere leaves the heartbeats; expired dead letters go.
local function maintenance()
  local gone = redis.call('ZRANGEBYSCORE', heartbeats, 0, tonumber(now) - timeout)
  for _, other in ipairs(gone) do
    local held = ns .. ':__acks__.' .. other .. '.' .. queue
    local ids = redis.call('SMEMBERS', held)
    for _, id in ipairs(ids) do
      if redis.call('HEXISTS', messages, id) == 1 then redis.call('RPUSH', list, id) end
    end
    if #ids > 0 then redis.call('DEL', held) end
    if #redis.call('KEYS', ns .. ':__acks__.' .. other .. '*') == 0 then
      redis.call('ZREM', heartbeats, other)
    end
  end
  local expired = redis.call('ZRANGEBYSCORE', dead, 0, tonumber(now) - dead_ttl)
  in_slices(expired, function(...)
    redis.call('ZREM', dead, ...)
    redis.call('HDEL', dead_messages, ...)
  end)
end

if command == 'fetch' then redis.call('ZADD', heartbeats, now, worker) end  -- before a maintenance finds it old
if maintain == '1' then maintenance() end

if command == 'enqueue' then
  redis.call('HSET', messages, ARGV[9], ARGV[10])
  redis.call('RPUSH', list, ARGV[9])
elseif command == 'fetch' then
  local ids = redis.call('LPOP', list, math.min(tonumber(ARGV[9]), max_unpack))
  if not ids then return {} end
  redis.call('SADD', acks, unpack(ids))
  return redis.call('HMGET', messages, unpack(ids))
elseif command == 'ack' then
  if redis.call('SREM', acks, ARGV[9]) == 1 then redis.call('HDEL', messages, ARGV[9]) end
elseif command == 'nack' then
  if redis.call('SREM', acks, ARGV[9]) == 1 then
    local message = redis.call('HGET', messages, ARGV[9])
    if message then
      redis.call('ZADD', dead, now, ARGV[9])
      redis.call('HSET', dead_messages, ARGV[9], message)
      redis.call('HDEL', messages, ARGV[9])
    end
  end
elseif command == 'requeue' then
  for i = 9, #ARGV do
    if redis.call('SREM', acks, ARGV[i]) == 1 and redis.call('HEXISTS', messages, ARGV[i]) == 1 then
      redis.call('RPUSH', list, ARGV[i])
    end
  end
elseif command == 'purge' then
  redis.call('DEL', list, acks, messages, dead, dead_messages)
elseif command == 'qsize' then
  local base = ns .. ':' .. canonical
  return redis.call('HLEN', base .. '.DQ.msgs') + redis.call('SCARD', worker_acks .. '.' .. canonical .. '.DQ')
    + redis.call('HLEN', base .. '.msgs') + redis.call('SCARD', worker_acks .. '.' .. canonical)
else
  return redis.error_reply('broker: unknown command ' .. command)
end
