-- admit: idempotency check, cost reservation, job creation and supersession, as one step.
--
-- Guarantees: for one (tenant, idempotency key) at most one job ever exists
-- while the record lives; the job's cost ceiling is reserved against the
-- tenant's allowance in the same step, or nothing at all is written. A job that
-- supersedes an older one of the same tenant replaces it in the same step: the
-- older job is cancelled (reason `superseded`) if it was not yet dispatched
-- (queued, retry_wait), otherwise only marked obsolete; an unknown older job
-- refuses the admission and writes nothing. The workflow is kept in a key of
-- its own, so the record stays small and the workflow can go when the job ends.
-- The job's times (created_at, updated_at, deadline = now + deadline_s) are stamped
-- here, on Redis's clock, whatever the API host's clock says.
-- The tenant's limits (`reckon tenant set`) are checked in the same step, after the
-- idempotency check (a retry of an admitted request is never limited) and before the
-- allowance: jobs in flight (queued, running, retry_wait, reconciling) below
-- `max_inflight`, and a token from the submission bucket (`rate` per second up to
-- `burst`, refilled on Redis's clock). A refused request writes nothing, the bucket
-- included.
-- Then the fleet-wide limits of the job's workload class (docs/api.md "Admission"), read from
-- the global figures in O(1): queued jobs of the class below its cap (else 503 queue_full);
-- a batch job is shed (503 load_shed) while the oldest queued interactive job has waited
-- longer than its target, unless interactive dispatch is paused; and with a service-time
-- estimate for the class, a job whose estimated finish (its own service time plus the
-- queued work dispatched before it, each class at its own estimate, spread over the fleet's
-- slots) falls after its deadline is refused (422). A queued job this admission supersedes
-- leaves in the same step, so it counts in no limit. Operator settings that are not numbers
-- are ignored (the defaults apply). Each refusal counts `refused:<reason>` in the global stats: the only write.
-- The idempotency record keeps no response body: the first response is rebuilt
-- from the job's fields that never change (id, kind, priority, outputs, ceiling,
-- deadline_s, created_at), so a replay is the same bytes.
--
-- Inputs (docs/api.md "Inputs"): a workflow that names uploaded inputs (ARGV[20] of them) is refused,
-- writing nothing but its refusal's count, unless the tenant has each one under the very name given;
-- the job created is added to each input's set of jobs and each input's last use is now. A workflow
-- naming none is given no key nor ARGV beyond the 30th and 19th: it costs not one command more.
--
-- keys: 30 or more
-- KEYS[1] old idempotency record         KEYS[9]  superseded job's record (hash; the new
-- KEYS[2] tenant ledger (hash)                    job's own when nothing is superseded)
-- KEYS[3] job record (hash)              KEYS[10] superseded job's event list (likewise)
-- KEYS[4] tenant's job index (zset)      KEYS[11] tenant's retry index (zset)
-- KEYS[5] tenant's queued index (zset)   KEYS[12] job's workflow (string)
-- KEYS[6] tenant's outbox (zset)         KEYS[13] tenant's done index (zset)
-- KEYS[7] job's event list               KEYS[14] superseded job's workflow (likewise)
-- KEYS[8] tenant's per-state counts      KEYS[15] wake set (zset: tenant -> when work is due)
--                                        KEYS[16] tenant's limits (hash: max_inflight, rate,
--                                                 burst, tokens, at, weight, hooks)
-- KEYS[20] admission settings (hash: queue_cap:<class>, target_s:interactive)
-- KEYS[21] fleet (hash: pause_class:<class>, vt:<class>, p:<superseded job id>)
-- KEYS[22] to KEYS[26] the superseded job's parts, packed if it ends here (`parts_at` in _lib.lua; likewise)
-- KEYS[27] to KEYS[30] the tenant's idempotency windows around the caller's clock (hashes, `idem_windows`
--   in _idem.lua), the first ARGV[18]; KEYS[1] is the key an earlier version wrote the record at (string)
--
-- KEYS[17] global stats (hash), KEYS[18] queue (zset), KEYS[19] due (zset):
--   see use_globals in _lib.lua
--
-- ARGV[1] now (ms; '' = Redis's clock)   ARGV[6] delay before the outbox republishes (ms)
-- ARGV[2] new job id                     ARGV[7] job record (JSON object of strings)
-- ARGV[3] request fingerprint (hex)      ARGV[8] first response status (HTTP code)
-- ARGV[4] cost ceiling (cost units)      ARGV[9] id of the superseded job ('' for none)
-- ARGV[5] idempotency retention (s)      ARGV[10] workflow (JSON text)
-- ARGV[11] dispatch slots in the fleet (sum of the servers' caps)
-- ARGV[12], ARGV[13] default queue cap of interactive, batch (jobs)
-- ARGV[14] default target wait of interactive jobs (s)
-- ARGV[15] shards the state is split into: a queue cap is fleet-wide, each shard keeps its share
-- ARGV[16] retention (ms; '' = 0: see finalize in _lib.lua)
-- ARGV[17] '1' when no configured server can run the workflow: a replay answers, anything else is refused
-- ARGV[18] the window of KEYS[27] (s since the epoch // ARGV[5])   ARGV[19] the Idempotency-Key
--
-- With inputs only, after the 30 keys: the tenant's inputs (hash: sha256 -> JSON input), the shard's
-- inputs by last use (zset: `<tenant>/<sha256>` -> ms), then one key per input: its jobs (set of job ids);
-- ARGV[20] the number of inputs, then each one's sha256 and name (`reckon/<sha256>.<ext>`), in turn.
--
-- Returns {1 CREATED, job_id, now (ms)} | {2 REPLAYED, job_id, status}
--   | {3 IN_PROGRESS, job_id} | {4 FINGERPRINT_MISMATCH, job_id}
--   | {5 INSUFFICIENT_ALLOWANCE, available, ceiling} | {6 UNKNOWN_TENANT} | {7 NOT_FOUND}
--   | {17 LIMITED, reason (max_inflight | rate | queue_full | load_shed), retry after (ms)}
--   | {18 INFEASIBLE, estimated finish (ms from now), deadline (ms from now)} | {19 UNSUPPORTED}
--   | {21 INPUT_UNKNOWN, each name the tenant has no input under, ...}

use_globals(17)
local now, job_id, fingerprint = clock(ARGV[1]), ARGV[2], ARGV[3]
local ceiling, record = tonumber(ARGV[4]), cjson.decode(ARGV[7])

local function refuse(reason, ...)
  redis.call('HINCRBY', G.stats, 'refused:' .. reason, 1)
  return {...}
end

-- A number an operator set (redis-cli may have set anything), else the default.
local function setting(value, default) return tonumber(value) or tonumber(default) end

-- Queued jobs of `class` (`n`: the shard's `jobs:<class>:queued`, which count_move keeps equal to the
-- class's range of the queue), less the one this admission supersedes (it leaves in the same step).
local function queued(class, n, leaving)
  n = tonumber(n or '0')
  return leaving == class and n - 1 or n
end

-- The fleet-wide limits of `class` (see the header): nil when the job may be admitted, else
-- the refusal reply. `leaving`: the class of a queued job this admission supersedes, or nil.
local function over_fleet_limits(class, deadline_ms, leaving)
  local cfg = redis.call('HMGET', KEYS[20], 'queue_cap:' .. class, 'target_s:interactive')
  local slots = math.max(1, tonumber(ARGV[11]))
  -- read with the total this admission's reservation adds to, so the call's end reads none again
  preload(G.stats, {'service_ms:interactive', 'service_ms:batch', 'jobs:interactive:queued', 'jobs:batch:queued',
    'ledger:reserved'})
  local known = hmget(G.stats, 'service_ms:interactive', 'service_ms:batch', 'jobs:interactive:queued',
    'jobs:batch:queued')
  local depth = {interactive = queued('interactive', known[3], leaving), batch = queued('batch', known[4], leaving)}
  local estimate = {interactive = tonumber(known[1] or ''), batch = tonumber(known[2] or '')}
  local own = estimate[class]
  local turn = own and math.max(1000, math.ceil(own / slots)) or 5000  -- Retry-After: a slot's turn
  local cap = setting(cfg[1], class == 'batch' and ARGV[13] or ARGV[12])
  if depth[class] >= math.ceil(cap / tonumber(ARGV[15])) then
    return refuse('queue_full', 17, 'queue_full', turn)
  end
  local interactive_first = not paused_for(KEYS[21], 'interactive')
  if class == 'batch' and interactive_first then
    local oldest = redis.call('ZRANGE', G.queue, 0, 0, 'WITHSCORES')[2]
    if oldest and tonumber(oldest) < tonumber(BATCH_RANK)
        and now - tonumber(oldest) > 1000 * setting(cfg[2], ARGV[14]) then
      return refuse('load_shed', 17, 'load_shed', turn)
    end
  end
  if not own then return nil end
  -- The work dispatched before this job, spread over the slots: its own class's queue and, for
  -- batch, the interactive queue unless interactive is paused (then batch goes first). Each
  -- class at its own estimate; a class with none yet at this job's.
  local ahead = depth[class] * own
  if class == 'batch' and interactive_first then ahead = ahead + depth.interactive * (estimate.interactive or own) end
  local finish = math.ceil(own + ahead / slots)
  if finish > deadline_ms then return refuse('deadline_infeasible', 18, finish, deadline_ms) end
  return nil
end

local idem_at = {{KEYS[27], KEYS[28], KEYS[29], KEYS[30]}, ARGV[18], math.max(1, tonumber(ARGV[5])), now}
local seen = idem_find(idem_at[1], idem_at[2], idem_at[3], now, ARGV[19], KEYS[1])
if seen then
  if not idem_matches(seen, fingerprint) then return {4, seen[2]} end
  if seen[3] ~= 'done' then return {3, seen[2]} end
  return {2, seen[2], tonumber(seen[4])}
end
if ARGV[17] == '1' then return {19} end  -- no server can run it: only a replay may answer, nothing is written
local inputs, past = tonumber(ARGV[20] or '') or 0, 30  -- past: the keys before the inputs' (see the header)
if inputs > 0 then
  local digests = {}
  for i = 1, inputs do digests[i] = ARGV[19 + 2 * i] end
  local known, unknown = redis.call('HMGET', KEYS[past + 1], unpack(digests)), {}
  for i = 1, inputs do
    if not known[i] or cjson.decode(known[i]).name ~= ARGV[20 + 2 * i] then unknown[#unknown + 1] = ARGV[20 + 2 * i] end
  end
  if #unknown > 0 then return refuse('input_unknown', 21, unpack(unknown)) end
end

local ledger = hmget(KEYS[2], 'allowance', 'reserved', 'settled', 'uncertain', 'vf:' .. record.priority)
if not ledger[1] then return {6} end
local older, leaving = '', nil
if ARGV[9] ~= '' then
  local o = hmget(KEYS[9], 'state', 'priority')
  older = o[1]
  if not older then return {7} end
  if older == 'queued' then leaving = o[2] end
end
local limit = redis.call('HMGET', KEYS[16], 'max_inflight', 'rate', 'burst', 'tokens', 'at', 'weight', 'hooks')
if limit[1] then
  local c = redis.call('HMGET', KEYS[8], 'queued', 'running', 'retry_wait', 'reconciling')
  local inflight = 0
  for _, n in ipairs(c) do inflight = inflight + tonumber(n or '0') end
  if older == 'queued' or older == 'retry_wait' then inflight = inflight - 1 end  -- it ends here
  if inflight >= tonumber(limit[1]) then return refuse('max_inflight', 17, 'max_inflight', 1000) end
end
local tokens
if limit[2] then
  local rate, burst = tonumber(limit[2]), tonumber(limit[3])
  tokens = math.min(burst, tonumber(limit[4] or burst) + (now - tonumber(limit[5] or now)) * rate / 1000)
  if tokens < 1 then return refuse('rate', 17, 'rate', math.ceil((1 - tokens) * 1000 / rate)) end
end
local refused = over_fleet_limits(record.priority, 1000 * tonumber(record.deadline_s), leaving)
if refused then return refused end
local available = tonumber(ledger[1]) - tonumber(ledger[2] or '0')
  - tonumber(ledger[3] or '0') - tonumber(ledger[4] or '0')
if ceiling > available then return refuse('insufficient_allowance', 5, available, ceiling) end

if tokens then redis.call('HSET', KEYS[16], 'tokens', tostring(tokens - 1), 'at', now) end
ledger_add(KEYS[2], 'reserved', ceiling)
local seq = hincrby(KEYS[2], 'job_seq', 1)
-- The job's place in fair dispatch (`finish_tag` in _slots.lua): after the tenant's last job of its class.
local cost = (tonumber(record.price) or 0) * (tonumber(record.outputs_requested) or 1)
record.vf = finish_tag(KEYS[21], record.priority, ledger[5], cost, limit[6])
hset(KEYS[2], 'vf:' .. record.priority, record.vf)
if limit[7] and limit[7] ~= '' then record.hooks = limit[7] end  -- webhook types asked for (`hook_event`)
local fields = {}
for field, value in pairs(record) do
  fields[#fields + 1] = field
  fields[#fields + 1] = value
end
created(KEYS[3])
hset(KEYS[3], 'seq', seq, unpack(fields))
hset(KEYS[3], 'created_at', now, 'updated_at', now,
  'deadline', now + 1000 * tonumber(hget(KEYS[3], 'deadline_s')))
redis.call('SET', KEYS[12], ARGV[10])
redis.call('ZADD', KEYS[4], seq, job_id)
redis.call('ZADD', KEYS[5], now, job_id)
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[6]), job_id)
wake(KEYS[15], KEYS[3], now + tonumber(ARGV[6]))
move(KEYS[3], KEYS[8], KEYS[7], now, '', 'queued', 'admitted')
idem_write(idem_at[1], idem_at[2], idem_at[3], now, ARGV[19], idem_text('pending', ARGV[8], fingerprint, job_id))
if inputs > 0 then
  local used = {}
  for i = 1, inputs do
    redis.call('SADD', KEYS[past + 2 + i], job_id)
    used[2 * i - 1], used[2 * i] = now, record.tenant .. '/' .. ARGV[19 + 2 * i]
  end
  redis.call('ZADD', KEYS[past + 2], unpack(used))
end

if older == 'queued' or older == 'retry_wait' then
  if hget(KEYS[9], 'servers') or hget(KEYS[9], 'ckpt') then  -- parked: its `placement` goes (_slots.lua)
    redis.call('HDEL', KEYS[21], 'p:' .. ARGV[9])
  end
  hset(KEYS[9], 'cancel_requested', 1, 'external_effect', external_effect(KEYS[9]))
  end_waiting(KEYS[9], {ledger = KEYS[2], queued = KEYS[5], retry = KEYS[11],
    events = KEYS[10], counts = KEYS[8], done = KEYS[13], workflow = KEYS[14], wake = KEYS[15],
    parts = parts_at(22), retention = ARGV[16]},
    now, older, 'cancelled', 'superseded')
elseif older == 'running' or older == 'reconciling' or older == 'needs_review' then
  hset(KEYS[9], 'obsolete', 1)
end
return {1, job_id, now}
