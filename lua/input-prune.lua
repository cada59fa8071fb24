-- input-prune: drops finished (or purged) jobs from an input's set of jobs, so the set of an input
-- named without pause stays near the number of its unfinished jobs; the retention pass calls it with
-- a sample of a large set's members (pipeline/state/inputs.py `prune`). It only ever removes a job
-- whose state is terminal or whose record is gone, as a delete does (lua/input-delete.lua): what it
-- removes can never be a job that still uses the input.
--
-- keys: 1 or more
-- KEYS[1] the input's jobs (set of job ids)
-- then one key per job id given: its record (hash)
--
-- ARGV[1..] the job ids, in the order of their records' keys
--
-- Returns {0 OK, jobs removed}

local UNFINISHED = {queued = true, running = true, retry_wait = true, reconciling = true, needs_review = true}
local removed = 0
for i, id in ipairs(ARGV) do
  if not UNFINISHED[redis.call('HGET', KEYS[1 + i], 'state') or ''] then
    removed = removed + redis.call('SREM', KEYS[1], id)
  end
end
return {0, removed}
