-- wrk script of ops/bench/bench.py's HTTP phase: every request is the same POST of a job body
-- ({"kind":"image","workflow":{...},"outputs":1}, the workflow about <workflow bytes>) with the
-- bearer key and an Idempotency-Key unique to the run, thread and request; every response whose
-- status is not <expected status> is counted.
--
-- args (after the URL): <api key> <expected status> <run tag> <workflow bytes>
-- Prints one line at the end: BENCH {"requests": n, "seconds": s, "p50_us": .., "p99_us": ..,
--   "max_us": .., "unexpected": n, "errors": n}  (errors: connect, read, write, timeout)

local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  expected = tonumber(args[2])
  tag = args[3]
  sent, unexpected = 0, 0
  wrk.method = "POST"
  wrk.headers["Authorization"] = "Bearer " .. args[1]
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = '{"kind":"image","workflow":{"3":{"class_type":"KSampler","inputs":{"text":"'
    .. string.rep("x", tonumber(args[4])) .. '"}}},"outputs":1}'
end

function request()
  sent = sent + 1
  wrk.headers["Idempotency-Key"] = tag .. "-" .. id .. "-" .. sent
  return wrk.format()
end

function response(status, headers, body)
  if status ~= expected then unexpected = unexpected + 1 end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do bad = bad + thread:get("unexpected") end
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests": %d, "seconds": %.6f, "p50_us": %d, "p99_us": %d, "max_us": %d, ' ..
    '"unexpected": %d, "errors": %d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99), latency.max,
    bad, e.connect + e.read + e.write + e.timeout))
end
