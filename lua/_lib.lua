-- Shared helpers, prepended to every script by pipeline/state/scripts.py.
-- They only touch keys their caller passes in; the caller's KEYS hold all of them.
--
-- Money: a job holds `reserved` (R, not yet spent), `charged` (C, known spent, not yet
-- settled) and `uncertain` (U, an attempt whose outcome is unknown). The tenant ledger
-- holds reserved = sum(R + C), uncertain = sum(U) and settled; so
-- allowance = available + reserved + uncertain + settled at every step.

-- Milliseconds on Redis's own clock (TIME), the one clock that decides leases and due
-- times; a test may pass a number instead (`given`), production passes ''.
local function clock(given)
  if given and given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Tells the sweeper that the job's tenant has work due at `at` (ms): the tenant's entry
-- in the wake set only ever moves earlier here; the sweeper sets it to the true next due
-- time after each visit.
local function wake(wakeset, job, at)
  redis.call('ZADD', wakeset, 'LT', at, hget(job, 'tenant'))
end

-- Event list -> the events this call appends to it, in order: pushed in one RPUSH when the call
-- ends (`push_events`), or packed with the job's earlier ones if the call packs the job.
local EVENTS = {}
-- The webhook events of this call, pushed in one RPUSH to the shard's webhook outbox (OUTBOX, the
-- key every call is passed last: pipeline/state/scripts.py) when the call ends: the state change
-- and its webhook event are one step (docs/webhooks.md).
local HOOKS, OUTBOX = {}, nil
-- The webhook event type of each state a job may enter; no other state makes one.
local HOOK_TYPES = {completed = 'job.completed', failed = 'job.failed', cancelled = 'job.cancelled',
  needs_review = 'job.needs_review'}

-- Queues webhook event `type` of `job` (its `event`: the table of the job event it comes from, which
-- gains the job, tenant, type and attempt) when the tenant asked for that type when the job was
-- admitted (the record's `hooks`, ',job.completed,job.progress,' say).
local function hook_event(job, type, event)
  local wanted = hget(job, 'hooks')
  if not wanted or not string.find(wanted, ',' .. type .. ',', 1, true) then return end
  event.job, event.tenant, event.type = hget(job, 'id'), hget(job, 'tenant'), type
  event.attempt = tonumber(hget(job, 'attempt_count') or '0')
  HOOKS[#HOOKS + 1] = cjson.encode(event)
end

-- Appends one state-change event to the job's event list (seq counts from 1).
local function append_event(job, events, now, from, to, reason)
  local seq = hincrby(job, 'event_seq', 1)
  local pending = EVENTS[events]
  if not pending then
    pending = {}
    EVENTS[events] = pending
  end
  local event = {seq = seq, at = tonumber(now), from = (from ~= '' and from) or cjson.null, to = to, reason = reason}
  pending[#pending + 1] = cjson.encode(event)
  changed(job, event)
  if HOOK_TYPES[to] then hook_event(job, HOOK_TYPES[to], event) end
end

-- Pushes the events of this call (run by the library after `pack_finished`), and adds each to the
-- stream of changes.
local function push_events()
  for events, pending in pairs(EVENTS) do redis.call('RPUSH', events, unpack(pending)) end
  EVENTS = {}
  for _, c in ipairs(CHANGED) do add_change(c) end
  CHANGED = {}
  if #HOOKS > 0 then redis.call('RPUSH', OUTBOX, unpack(HOOKS)) end
  HOOKS = {}
end

-- Figures over all tenants of the shard (a script's keys are all in one shard, `{s<n>}`), kept in
-- step by every script that moves a job or money, so /metrics, `reckon status` and admission read
-- them in O(1) whatever the number of tenants (readers add the shards up):
--   G.stats  hash: `jobs:<class>:<state>` counts, `ledger:<kind>` totals, counters, histograms,
--            `service_ms:<class>` estimates (docs/redis.md "Keys" lists every field);
--   G.queue  zset: queued job id -> class rank + when it was queued (ms);
--   G.due    zset: unfinished job id -> class rank + its deadline (ms).
-- A class rank is 0 for interactive and BATCH_RANK for batch, so one range reads one class.
-- Each script that needs them calls use_globals with the position of the three in its KEYS.
local G
local function use_globals(first)
  G = {stats = KEYS[first], queue = KEYS[first + 1], due = KEYS[first + 2]}
end

-- A batch job's rank in the parked set and the global indexes starts here (interactive ranks
-- are plain times in ms).
local BATCH_RANK = '10000000000000'
local function class_rank(class) return class == 'batch' and tonumber(BATCH_RANK) or 0 end

local TERMINAL = {completed = true, failed = true, cancelled = true}
-- Upper bounds (s) of the time-to-completion histogram, and of attempts per completed job.
local TTC_BOUNDS = {1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200}
local ATTEMPT_BOUNDS = {1, 2, 3, 5, 10}

-- Adds one observation to histogram `name` of `class`: its bucket, sum and count.
local function observe(name, class, bounds, value)
  local le = '+Inf'
  for _, bound in ipairs(bounds) do
    if value <= bound then le = tostring(bound) break end
  end
  bump(G.stats, name .. ':' .. class .. ':' .. le, 1)
  bump(G.stats, name .. '_sum:' .. class, value, true)
  bump(G.stats, name .. '_count:' .. class, 1)
end

-- Adds `amount` to a tenant ledger field and to its total over all tenants (to the ledger's copy
-- when the call read it: lua/_cache.lua `add`).
local function ledger_add(ledger, field, amount)
  add(ledger, field, amount)
  bump(G.stats, 'ledger:' .. field, amount)
end

-- The state changes of this call, returned beside its reply so the caller logs each one
-- (pipeline/state/scripts.py): job, from, to, reason, attempt, generation, error class.
local MOVES = {}
-- Job record -> the lease generation this call ended (`release`), for MOVES.
local HELD = {}

-- Keeps the global figures in step with one state change of a job (`f`: the job's id,
-- priority, deadline, created_at, attempt_count, error_class, lease_gen, attempts_not_sent).
local function count_move(f, now, from, to)
  local id, class, rank = f[1], f[2], class_rank(f[2])
  if from ~= '' then bump(G.stats, 'jobs:' .. class .. ':' .. from, -1) end
  bump(G.stats, 'jobs:' .. class .. ':' .. to, 1)
  if to == 'queued' then redis.call('ZADD', G.queue, rank + now, id) end
  if from == 'queued' then redis.call('ZREM', G.queue, id) end
  if from == '' or TERMINAL[from] then redis.call('ZADD', G.due, rank + tonumber(f[3]), id) end
  if not TERMINAL[to] then return end
  redis.call('ZREM', G.due, id)
  local error_class = (f[6] and f[6] ~= '') and f[6] or 'none'
  bump(G.stats, 'finished:' .. class .. ':' .. to .. ':' .. error_class, 1)
  observe('ttc', class, TTC_BOUNDS, (now - tonumber(f[4])) / 1000)
  if to == 'completed' then  -- submissions: an attempt that sent nothing is not one
    observe('attempts', class, ATTEMPT_BOUNDS, tonumber(f[5] or '0') - tonumber(f[8] or '0'))
  end
  if to == 'failed' then bump(G.stats, 'dead_letters_total', 1) end
end

-- Moves a job from one state to another: record, per-state counts (the tenant's and the
-- global ones), event log, and the list of changes the caller logs.
local function move(job, counts, events, now, from, to, reason)
  hset(job, 'state', to, 'updated_at', now)
  if from ~= '' then bump(counts, from, -1) end
  bump(counts, to, 1)
  append_event(job, events, now, from, to, reason)
  local f = hmget(job, 'id', 'priority', 'deadline', 'created_at', 'attempt_count', 'error_class',
    'lease_gen', 'attempts_not_sent')
  count_move(f, now, from, to)
  MOVES[#MOVES + 1] = {f[1], from, to, reason, f[5] or '0', HELD[job] or f[7] or '0', f[6] or ''}
end

-- True when the job is running or reconciling under lease generation `gen` (a string).
-- Every change of owner raises the generation (claims, and `release`), so only the
-- current holder passes.
local function holds_lease(job, gen)
  local f = hmget(job, 'state', 'lease_gen')
  return (f[1] == 'running' or f[1] == 'reconciling') and f[2] == gen
end

-- Renews the lease of the job's holder to `expires` (ms) on the record. The tenant's leases index
-- (and the wake set) keep an entry where it is while the expiry only moves later: an entry at or
-- before the record's `lease_expires` is all the sweeper needs, since there it finds the lease
-- renewed (reconcile-begin: NOT_DUE) and moves the entry to the record's expiry, so an expired
-- lease is seen as soon as it would be with every renewal indexed. An earlier expiry (a holder
-- with a shorter lease) is indexed at once.
local function renew(job, leases, wakeset, expires)
  local before = tonumber(hget(job, 'lease_expires') or '0')
  hset(job, 'lease_expires', expires)
  if expires >= before and before > 0 then return end
  redis.call('ZADD', leases, expires, hget(job, 'id'))
  if wakeset then wake(wakeset, job, expires) end
end

-- Ends the job's lease, whoever holds it: the generation goes up, so the last holder
-- (a worker, a reconciler, or a stalled one of either) can no longer write. The generation
-- that was held is what the state-change log shows for the change the holder made.
local function release(job, leases, job_id)
  HELD[job] = hincrby(job, 'lease_gen', 1) - 1
  hset(job, 'lease_owner', '', 'lease_expires', 0)
  redis.call('ZREM', leases, job_id)
end

-- Closes the job's current attempt record with a final state. A closed attempt stays
-- closed, except an `unknown` one, which reconciliation resolves (and marks reconciled).
-- `unsent`: nothing left for a server, so a submit mark the attempt made is taken back.
local function end_attempt(job, attempts, now, state, error_class, unsent)
  local f = hmget(job, 'attempt_count', 'attempt_ms')
  local n = f[1]
  local raw = hget(attempts, n)
  if not raw then return end
  local attempt = cjson.decode(raw)
  if attempt.state == 'unknown' then
    attempt.reconciled = true
  elseif attempt.state ~= 'running' then
    return
  end
  attempt.state = state
  attempt.ended_at = tonumber(now)
  attempt.error_class = (error_class ~= '' and error_class) or cjson.null
  if unsent then attempt.submitted_at = cjson.null end
  local charged_n, ms = string.match(f[2] or '', '^(%d+):(%d+)$')  -- the seconds its charge booked
  if charged_n == n then attempt.seconds_ms = tonumber(ms) end
  hset(attempts, n, cjson.encode(attempt))
end

local LEDGER_FIELD = {reserved = 'reserved', charged = 'reserved', uncertain = 'uncertain'}

-- Moves `amount` cost units between a job's buckets (reserved, charged, uncertain),
-- keeping the tenant ledger in step. Never moves more than the source holds.
local function shift(job, ledger, from, to, amount)
  amount = math.min(tonumber(amount), tonumber(hget(job, from) or '0'))
  if amount <= 0 then return 0 end
  hincrby(job, from, -amount)
  hincrby(job, to, amount)
  if LEDGER_FIELD[from] ~= LEDGER_FIELD[to] then
    ledger_add(ledger, LEDGER_FIELD[from], -amount)
    ledger_add(ledger, LEDGER_FIELD[to], amount)
  end
  return amount
end

-- Appends one entry to a job's list of bookings `field` (comma separated: pipeline/state/booked.py).
local function booking(job, field, entry)
  local before = hget(job, field)
  hset(job, field, before and (before .. ',' .. entry) or entry)
end

-- Resolves the job's uncertain hold, all of it, into `to`: charged (the run happened, or its outcome
-- stays unknowable) or reserved (it provably never ran, or the provider's own report replaces it). A
-- booking of its own, `uncertain:<job>:<attempt>` in the usage records (pipeline/state/records.py):
-- appended to the job's `holds` ('<attempt> <units> charged|released <server>', comma separated), in the
-- record's one HSET (no command added); once, since a resolved hold moves nothing again. Returns the units.
local function resolve_hold(job, ledger, to)
  local held = shift(job, ledger, 'uncertain', to, hget(job, 'uncertain') or '0')
  if held > 0 then
    booking(job, 'holds', (hget(job, 'attempt_count') or '0') .. ' ' .. held
      .. (to == 'charged' and ' charged ' or ' released ') .. (hget(job, 'server') or ''))
  end
  return held
end

-- Books what the provider charged for the job's current attempt (`units`), once per attempt (a
-- second call books 0): whatever the attempt held as uncertain goes back to reserved first (the
-- provider's own report replaces the guess), then `units` move from reserved to charged. More than
-- the job holds is booked too (the money was spent): recorded on the job (`overrun`) and counted
-- (`charge_overruns_total`). `seconds` ('' none): `<attempt>:<ms>`, the execution the charge is for,
-- kept as `attempt_ms` until `end_attempt` copies it onto that attempt's record (`seconds_ms`).
-- Returns the units booked and those beyond what the job held.
local function charge_attempt(job, ledger, units, seconds)
  if hget(job, 'attempt_charged') == '1' then return 0, 0 end
  if seconds and seconds ~= '' then hset(job, 'attempt_charged', 1, 'attempt_ms', seconds) else hset(job, 'attempt_charged', 1) end
  -- the attempt's charge, `charge:<job>:<attempt>` in the usage records and the job's view
  booking(job, 'charges', (hget(job, 'attempt_count') or '0') .. ' ' .. units .. ' ' .. (hget(job, 'server') or ''))
  resolve_hold(job, ledger, 'reserved')
  local over = units - shift(job, ledger, 'reserved', 'charged', units)
  if over > 0 then
    hincrby(job, 'charged', over)
    hincrby(job, 'overrun', over)
    ledger_add(ledger, 'reserved', over)
    redis.call('HINCRBY', G.stats, 'charge_overruns_total', 1)
  end
  return units, over
end

-- Whether a provider execution happened for the job: `occurred` (something was
-- charged), `possible` (submitted, or cost held uncertain) or `none`.
local function external_effect(job)
  local f = hmget(job, 'charged', 'settled', 'uncertain', 'submitted')
  if tonumber(f[1] or '0') + tonumber(f[2] or '0') > 0 then return 'occurred' end
  if tonumber(f[3] or '0') > 0 or f[4] == '1' then return 'possible' end
  return 'none'
end

-- Settles a job that is ending: what it was charged becomes settled, the rest of its
-- reservation is released. Anything still uncertain is taken as charged: releasing it
-- would understate what may be owed. Called only on a transition into a terminal state.
local function settle(job, ledger, now)
  resolve_hold(job, ledger, 'charged')
  local f = hmget(job, 'reserved', 'charged')
  local reserved, charged = tonumber(f[1] or '0'), tonumber(f[2] or '0')
  ledger_add(ledger, 'reserved', -(reserved + charged))
  ledger_add(ledger, 'settled', charged)
  hincrby(job, 'settled', charged)
  hset(job, 'reserved', 0, 'charged', 0, 'settled_at', now)
end

-- Jobs of this call that ended completed or cancelled -> {workflow, parts}: packed when the call
-- ends (`pack_finished`, run by the library before `save_records`), after its last event.
local PACKS = {}

-- Record fields only a live attempt uses, and copies of its last attempt's (kept with its attempts): a
-- packed job drops them, and its progress marks (`pm:<attempt>:<node>`, lua/progress.lua).
local LIVE_FIELDS = {lease_owner = true, lease_expires = true, slot_held = true, sends = true,
  attempt_charged = true, submit_epoch = true, operation_id = true, provider = true, server = true,
  attempt_price = true, submitted_at = true, vf = true, servers = true, ckpt = true, hooks = true,
  attempt_ms = true}

-- The five keys a finished job is packed from, from KEYS[first] on (the caller passes them in this
-- order: pipeline/state/keys.py `JobKeys.parts`): declared, as a Cluster's slot migration needs every key.
local function parts_at(first)
  return {attempts = KEYS[first], events = KEYS[first + 1], outputs = KEYS[first + 2],
    progress = KEYS[first + 3], seen = KEYS[first + 4]}
end

-- A finished job becomes one key, its record: `state` and the compact field `z` (lua/_codec.lua),
-- which holds its other fields and its attempts, state events and outputs; their keys go, with the
-- workflow, the progress points and the fields of LIVE_FIELDS. The events this call appended are
-- packed with the stored ones, never pushed; the record is written anew (DEL, then one HSET:
-- `rewrite` in _cache.lua).
local function pack_finished()
  for job, pack in pairs(PACKS) do
    local p, fields = pack.parts, hgetall(job)
    local stored, attempts, outputs = hgetall(p.attempts), {}, {}
    while stored[tostring(#attempts + 1)] do attempts[#attempts + 1] = stored[tostring(#attempts + 1)] end
    for index, raw in pairs(hgetall(p.outputs)) do outputs[#outputs + 1] = {index = tonumber(index), raw = raw} end
    table.sort(outputs, function(x, y) return x.index < y.index end)
    forget(p.attempts)
    forget(p.outputs)
    local events = redis.call('LRANGE', p.events, 0, -1)
    for _, raw in ipairs(EVENTS[p.events] or {}) do events[#events + 1] = raw end
    EVENTS[p.events] = nil
    local kept = {}
    for name, text in pairs(fields) do
      if not LIVE_FIELDS[name] and string.sub(name, 1, 3) ~= 'pm:' then kept[name] = text end  -- pm: progress marks
    end
    local z = pack_value(string.match(job, ':job:(.*)$'), kept, attempts, events, outputs)
    rewrite(job, {state = fields.state, z = z})
    redis.call('DEL', job, p.attempts, p.events, p.outputs, p.progress, p.seen, pack.workflow)
  end
  PACKS = {}
end

-- Ends a job for good (completed, failed or cancelled): settled once, entered in the
-- tenant's done index for the retention period (then the sweeper purges it), and, unless it
-- failed, packed into one key when the call ends (`pack_finished`: its workflow goes then). A dead
-- letter keeps its keys and its workflow: what a replay needs. `k` names the keys: ledger, done,
-- workflow, wake, and parts (`parts_at`) unless the job can only fail here; and `retention`, the
-- caller's retention (ms, a string; '' or none: 0): the tenant is woken when the job is due for
-- purging, not at once (a visit per finished job was a sweeper pass of every index of its tenant).
local function finalize(job, k, now, outcome)
  settle(job, k.ledger, now)
  redis.call('ZADD', k.done, now, hget(job, 'id'))
  if outcome ~= 'failed' then
    if not k.parts then error('finalize: a job that ends ' .. outcome .. ' needs its parts to be packed') end
    PACKS[job] = {workflow = k.workflow, parts = k.parts}
  end
  wake(k.wake, job, now + (tonumber(k.retention or '') or 0))
end

-- Ends a job that is queued, waiting to retry or waiting for review: it leaves those
-- indexes and is finalized; the error of an earlier attempt is not its outcome, so a
-- cancelled job carries none. `k` adds queued, retry, events, counts to finalize's keys.
-- (An outbox entry stays until the sweeper confirms it: that marks the idempotency record done.)
local function end_waiting(job, k, now, from, to, reason)
  local job_id = hget(job, 'id')
  redis.call('ZREM', k.queued, job_id)
  redis.call('ZREM', k.retry, job_id)
  finalize(job, k, now, to)
  if to == 'cancelled' then hset(job, 'error_class', '', 'error_reason', '') end
  move(job, k.counts, k.events, now, from, to, reason)
end

-- Fails a queued job whose deadline has passed before any worker took it: settled,
-- dead-lettered, never dispatched. `k`: finalize's keys plus queued, dead, events, counts.
local function expire_queued(job, k, now, reason)
  local job_id = hget(job, 'id')
  redis.call('ZREM', k.queued, job_id)
  finalize(job, k, now, 'failed')
  hset(job, 'error_class', 'deadline_exceeded', 'error_reason', reason)
  redis.call('ZADD', k.dead, now, job_id)
  move(job, k.counts, k.events, now, 'queued', 'failed', 'deadline_exceeded')
end
