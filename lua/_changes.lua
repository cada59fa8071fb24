-- The stream of changes (prepended to every script with the other helpers: pipeline/state/scripts.py).
-- `append_event` in _lib.lua and lua/progress.lua queue an entry per job event; `push_events` adds them.

-- The job events of this call, each added to the shard's stream of changes (CHANGES, the key every call
-- is passed after OUTBOX) by one XADD when the call ends, beside the job's own lists: what wakes the
-- event streams (api/streams/, docs/api.md "Event streams"). An entry is `job` and `event`: the event's
-- values as a JSON array in the order of CHANGE_KEYS for its kind (a state event has no `type`; the
-- streams process spells it out as the job's list holds it: api/streams/hub.py), the tenant being the
-- job id's. The entry's id is the event's moment (`<at>-*`), which its values then leave out; when the
-- stream already holds a later id (a clock given by a test, or one that stepped back) it takes the next
-- id and keeps `at` first among its values. About CHANGES_KEPT entries are kept (MAXLEN ~: Redis trims
-- whole nodes, so a few more).
local CHANGED, CHANGES = {}, nil
local CHANGES_KEPT = 100000
local CHANGE_KEYS = {state = {'at', 'to', 'from', 'seq', 'reason'},
  progress = {'at', 'type', 'max', 'attempt', 'value', 'seq', 'node'}}

-- Queues the change entry of one event (its table) of `job`: {job id, at, values without at}.
local function changed(job, event)
  local values = {}
  for i, name in ipairs(CHANGE_KEYS[event.type or 'state']) do
    if i > 1 then
      local value = event[name]
      if value == nil then value = cjson.null end
      values[i - 1] = value
    end
  end
  CHANGED[#CHANGED + 1] = {hget(job, 'id'), event.at, values}
end

-- Adds one queued change to the stream of changes, its id its moment when the stream allows it.
local function add_change(c)
  local at = string.format('%d', c[2])
  local added = redis.pcall('XADD', CHANGES, 'MAXLEN', '~', CHANGES_KEPT, at .. '-*', 'job', c[1],
    'event', cjson.encode(c[3]))
  if type(added) == 'table' and added.err then
    table.insert(c[3], 1, c[2])
    redis.call('XADD', CHANGES, 'MAXLEN', '~', CHANGES_KEPT, '*', 'job', c[1], 'event', cjson.encode(c[3]))
  end
end
