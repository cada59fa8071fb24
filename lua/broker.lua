-- broker: the dispatch script of reckon's Redis broker (pipeline/work/waking.py), in place of the one
-- Dramatiq ships: the same calls and replies, so Dramatiq's Python side is unchanged, with fewer
-- Redis commands per message. Not part of the state library (pipeline/state/scripts.py skips it by
-- name, `SEPARATE`): the broker registers it itself, on the broker's own Redis database.
--
-- Keys, under the namespace KEYS[1]:
--   <ns>:<queue>                      list of waiting messages, each `<message id> <message>`
--   <ns>:__held__.<worker>.<queue>    hash message id -> message: fetched by that worker, not acked
--   <ns>:__heartbeats__               zset worker -> its last heartbeat (ms)
--   <ns>:<queue>.XQ, <ns>:<queue>.XQ.msgs   dead-lettered ids by when, and their messages
-- and, written by Dramatiq's own script (a broker of an earlier version), read until they are
-- empty: list items that are bare message ids, whose messages are in the hash `<ns>:<queue>.msgs`,
-- and a worker's fetched ids in the set `<ns>:__acks__.<worker>.<queue>`.
--
-- ARGV: command, the caller's clock (ms; not used: every time here is Redis's own, so a host
-- whose clock is off is neither taken for dead nor keeps a dead worker alive), queue, worker id,
-- heartbeat timeout (ms), dead message ttl (ms), maintenance ('1' to run it), largest unpack, then
-- the command's own arguments.
--
-- What differs from Dramatiq's script, and why it holds:
-- - A message is stored once, in its queue's list while it waits and in its worker's held hash
--   from its fetch to its ack: an enqueue is one RPUSH, a fetch one LPOP of up to its count and one
--   HSET, an ack one HDEL (Dramatiq's: a hash of messages and a list and a set of ids).
-- - The heartbeat is written when the caller asks (a fetch whose last argument is not '' (Dramatiq's
--   own fetch passes none), or `heartbeat`): the consumer asks at most every quarter of the timeout,
--   when it fetches and, while it holds as many messages as it may, on its own (pipeline/work/waking.py),
--   so a live worker is never taken for dead; a process that only publishes writes none. A worker
--   that holds messages and has no heartbeat at all (taken for dead and dropped from the heartbeats
--   while it was silent, it came back and fetched before its next heartbeat was due) is dead to the
--   maintenance pass too, so no held message can outlive its worker unseen.
-- Per message: enqueue 2 commands, fetch 3 (5 with a heartbeat: TIME and ZADD), ack 2 (Dramatiq's: 4, 6, 4).

local ns = KEYS[1]
local command, queue, worker = ARGV[1], ARGV[3], ARGV[4]
-- Redis's clock in ms, read once and only by a call that needs it (a heartbeat, maintenance, a nack).
local clock_ms
local function now()
  if not clock_ms then
    local t = redis.call('TIME')
    clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock_ms
end
local timeout, dead_ttl, maintain, max_unpack = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])

local canonical = queue
if string.sub(queue, -3) == '.DQ' then canonical = string.sub(queue, 1, -4) end
local heartbeats = ns .. ':__heartbeats__'
local list = ns .. ':' .. queue
local held = ns .. ':__held__.' .. worker .. '.' .. queue
local legacy_messages = list .. '.msgs'
local legacy_acks = ns .. ':__acks__.' .. worker .. '.' .. queue
local dead = ns .. ':' .. canonical .. '.XQ'
local dead_messages = dead .. '.msgs'

-- Calls `fn` with the items of `items` in slices no longer than Lua's stack allows.
local function in_slices(items, fn)
  for first = 1, #items, max_unpack do
    fn(unpack(items, first, math.min(first + max_unpack - 1, #items)))
  end
end

-- Workers whose heartbeat is older than the timeout: their held messages of this queue go back to
-- it (and their ids of an earlier version's set); a dead worker holding nothing anywhere leaves the
-- heartbeats. Expired dead letters go.
local function maintenance()
  local gone = redis.call('ZRANGEBYSCORE', heartbeats, 0, now() - timeout)
  local known = {}
  for _, other in ipairs(gone) do known[other] = true end
  local prefix, suffix = ns .. ':__held__.', '.' .. queue
  for _, key in ipairs(redis.call('KEYS', prefix .. '*' .. suffix)) do
    local other = string.sub(key, #prefix + 1, #key - #suffix)
    if not known[other] and not redis.call('ZSCORE', heartbeats, other) then
      known[other] = true
      gone[#gone + 1] = other
    end
  end
  for _, other in ipairs(gone) do
    local theirs = ns .. ':__held__.' .. other .. '.' .. queue
    local flat = redis.call('HGETALL', theirs)
    for i = 1, #flat, 2 do redis.call('RPUSH', list, flat[i] .. ' ' .. flat[i + 1]) end
    local old = ns .. ':__acks__.' .. other .. '.' .. queue
    for _, id in ipairs(redis.call('SMEMBERS', old)) do
      if redis.call('HEXISTS', legacy_messages, id) == 1 then redis.call('RPUSH', list, id) end
    end
    redis.call('DEL', theirs, old)
    if #redis.call('KEYS', ns .. ':__held__.' .. other .. '.*') == 0
        and #redis.call('KEYS', ns .. ':__acks__.' .. other .. '.*') == 0 then
      redis.call('ZREM', heartbeats, other)
    end
  end
  local expired = redis.call('ZRANGEBYSCORE', dead, 0, now() - dead_ttl)
  in_slices(expired, function(...)
    redis.call('ZREM', dead, ...)
    redis.call('HDEL', dead_messages, ...)
  end)
end

-- Takes the fetched message `id` out of the worker's hands: its message, or nil if it held none.
local function release(id)
  local message = redis.call('HGET', held, id)
  if message then
    redis.call('HDEL', held, id)
    return message
  end
  if redis.call('SREM', legacy_acks, id) == 1 then  -- fetched by an earlier version's script
    message = redis.call('HGET', legacy_messages, id)
    if message then redis.call('HDEL', legacy_messages, id) end
    return message
  end
  return nil
end

if command == 'heartbeat' or maintain == '1' or (command == 'fetch' and ARGV[10] ~= '') then
  redis.call('ZADD', heartbeats, now(), worker)  -- before a maintenance pass finds it old
end
if maintain == '1' then maintenance() end

if command == 'enqueue' then
  redis.call('RPUSH', list, ARGV[9] .. ' ' .. ARGV[10])
elseif command == 'fetch' then
  local count = math.min(tonumber(ARGV[9]), max_unpack)
  if count < 1 then return {} end
  local items = redis.call('LPOP', list, count)
  if not items then return {} end
  local messages, pairs_ = {}, {}
  for i, item in ipairs(items) do
    local id, message = string.match(item, '^(%S+) (.*)$')
    if not id then  -- a bare id: an earlier version's message, kept in the queue's hash
      id, message = item, redis.call('HGET', legacy_messages, item)
      if message then redis.call('HDEL', legacy_messages, id) end
    end
    messages[i] = message or false
    if message then
      pairs_[#pairs_ + 1] = id
      pairs_[#pairs_ + 1] = message
    end
  end
  if #pairs_ > 0 then redis.call('HSET', held, unpack(pairs_)) end
  return messages
elseif command == 'ack' then
  if redis.call('HDEL', held, ARGV[9]) == 0 and redis.call('SREM', legacy_acks, ARGV[9]) == 1 then
    redis.call('HDEL', legacy_messages, ARGV[9])
  end
elseif command == 'nack' then
  local message = release(ARGV[9])
  if message then
    redis.call('ZADD', dead, now(), ARGV[9])
    redis.call('HSET', dead_messages, ARGV[9], message)
  end
elseif command == 'requeue' then
  for i = 9, #ARGV do
    local message = release(ARGV[i])
    if message then redis.call('RPUSH', list, ARGV[i] .. ' ' .. message) end
  end
elseif command == 'purge' then
  redis.call('DEL', list, held, legacy_messages, legacy_acks, dead, dead_messages)
elseif command == 'qsize' then
  local base = ns .. ':' .. canonical
  return redis.call('LLEN', base) + redis.call('HLEN', ns .. ':__held__.' .. worker .. '.' .. canonical)
    + redis.call('HLEN', base .. '.msgs') + redis.call('SCARD', ns .. ':__acks__.' .. worker .. '.' .. canonical)
elseif command ~= 'heartbeat' then
  return redis.error_reply('broker: unknown command ' .. command)
end
