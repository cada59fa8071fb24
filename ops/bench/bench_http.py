"""The HTTP phase of ops/bench/bench.py: admission through gunicorn against a trivial authenticated route.

One gunicorn (ops/gunicorn.conf.py, its default workers and threads) serves ``ops/bench/bench_app.py``:
reckon's app plus ``/bench/ping``. The load generator runs in other processes than the server: ``wrk``
(Debian's) with ops/bench/bench_wrk.lua, or, without wrk, one Python process per connection (http.client,
keep-alive). Both sides get the same request: a POST of a job body with a ~1 KiB workflow, the bearer
key and a unique Idempotency-Key; the ping must answer 200, admission 202. No worker runs: this is
admission alone (the queue cap is raised by the bench's environment).
"""

from __future__ import annotations

import http.client
import multiprocessing
import subprocess
import time
from dataclasses import dataclass

import orjson

from ops.bench.bench_report import Row, Section
from ops.bench.benchlib import ROOT, Bench, percentile, shard_totals

#: The two sides: name, path, the status every response must have.
SIDES = (("bare", "/bench/ping", 200), ("reckon", "/v1/jobs", 202))


@dataclass
class Load:
    """What a load generator saw: responses, seconds, latency percentiles, wrong statuses, errors."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    unexpected: int
    errors: int

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


@dataclass
class Target:
    """Where and how to load: the server's port, a path, the API key, the status expected."""

    port: int
    path: str
    key: str
    expected: int
    workflow_bytes: int
    connections: int
    threads: int


def wrk(target: Target, tag: str, seconds: float) -> Load:
    url = f"http://127.0.0.1:{target.port}{target.path}"
    argv = ["wrk", f"-t{target.threads}", f"-c{target.connections}", f"-d{seconds:g}s", "--latency",
            "-s", str(ROOT / "ops/bench/bench_wrk.lua"), url, "--", target.key, str(target.expected), tag,
            str(target.workflow_bytes)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    line = next((line for line in out.splitlines() if line.startswith("BENCH ")), None)
    if line is None:
        raise SystemExit(f"bench: wrk printed no figures:\n{out}")
    f = orjson.loads(line.removeprefix("BENCH "))
    return Load(f["requests"], f["seconds"], f["p50_us"] / 1000, f["p99_us"] / 1000, f["unexpected"], f["errors"])


def _client(target: Target, tag: str, seconds: float) -> tuple[list[float], int, int, float]:
    """One process, one keep-alive connection, POSTs for ``seconds``: latencies, wrong statuses, errors, span."""
    workflow = {"3": {"class_type": "KSampler", "inputs": {"text": "x" * target.workflow_bytes}}}
    body = orjson.dumps({"kind": "image", "workflow": workflow, "outputs": 1})
    headers = {"Authorization": f"Bearer {target.key}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
    latencies, unexpected, errors, sent = [], 0, 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sent += 1
        t0 = time.perf_counter()
        try:
            conn.request("POST", target.path, body, headers | {"Idempotency-Key": f"{tag}-{sent}"})
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            continue
        latencies.append(time.perf_counter() - t0)
        unexpected += resp.status != target.expected
    conn.close()
    return latencies, unexpected, errors, time.perf_counter() - start


def python_clients(target: Target, tag: str, seconds: float) -> Load:
    """Without wrk: ``connections`` client processes (not the server's, nor one another's GIL)."""
    with multiprocessing.get_context("fork").Pool(target.connections) as pool:
        results = pool.starmap(_client, [(target, f"{tag}-{n}", seconds) for n in range(target.connections)])
    latencies = [lat for result in results for lat in result[0]]
    return Load(len(latencies), max(r[3] for r in results), percentile(latencies, 50) * 1000,
                percentile(latencies, 99) * 1000, sum(r[1] for r in results), sum(r[2] for r in results))


def run(bench: Bench) -> Section:
    from pipeline.state.tenants import create_key, create_tenant

    args, client = bench.args, bench.client()
    create_tenant(client, "bench", 10**12)
    key = create_key(client, "bench")
    load = wrk if args.http_client == "wrk" else python_clients
    port = bench.start_web("web", "ops.bench.bench_app:create_app()")
    loads = {}
    for side, path, expected in SIDES:
        target = Target(port, path, key, expected, args.workflow_bytes, args.http_connections, args.http_threads)
        warm = load(target, f"{side}-warm", args.http_warmup)
        measured = load(target, side, args.http_seconds)
        loads[side] = warm, measured
        if warm.unexpected or warm.errors or measured.unexpected or measured.errors:
            raise SystemExit(f"bench: {side} {path} answered other than {expected}: warm-up {warm}, run {measured}")
    bench.stack.stop("web")
    (_, bare), (ours_warm, ours) = loads["bare"], loads["reckon"]
    [admitted] = shard_totals(client, bench.shards, "jobs:interactive:queued")
    if admitted < ours_warm.requests + ours.requests:
        raise SystemExit(f"bench: {ours_warm.requests + ours.requests} answers 202 but {admitted} jobs queued")
    client_text = (f"wrk -t{args.http_threads} -c{args.http_connections}" if args.http_client == "wrk"
                   else f"{args.http_connections} Python client processes")
    return Section(
        f"HTTP: gunicorn (ops/gunicorn.conf.py defaults), {client_text}, {args.http_seconds:g} s a side",
        notes=[f"bare: POST /bench/ping (authenticated, 200), {bare.requests:,} requests; reckon: POST /v1/jobs "
               f"({args.workflow_bytes} B workflow), {ours.requests:,} requests, every one 202, none in error; "
               f"{admitted:,} jobs queued: those and {ours_warm.requests:,} of the warm-up, and "
               f"{admitted - ours.requests - ours_warm.requests} answered after the client stopped counting"],
        rows=[
            Row("HTTP requests/s", bare.rate, ours.rate, ">= 0.5x", ours.rate >= 0.5 * bare.rate),
            Row("HTTP latency p50, ms", bare.p50_ms, ours.p50_ms),
            Row("HTTP latency p99, ms", bare.p99_ms, ours.p99_ms, "reported"),
        ])
