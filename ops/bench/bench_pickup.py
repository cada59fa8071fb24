"""The pickup phase of ops/bench/bench.py: how long a job waits on an idle stack before a worker takes it.

Each side starts idle (its worker up, nothing queued, ``--pickup-idle`` seconds of quiet so Dramatiq's
consumers are in their longest back-off), then gets one job at a time, each after the previous one
has finished and a random pause of ``--pickup-pause`` seconds, so each finds the worker idle.

- bare: ``noop.send`` from here, timed from just before the send to the actor's receipt
  (``time.time()`` pushed by ops/bench/bench_noop.py when ``BENCH_RECEIPTS`` is set);
- reckon: ``POST /v1/jobs`` through gunicorn to a worker (null provider), timed from the job's
  ``created_at`` (stamped by the admission script) to its attempt's ``started_at`` (stamped by the
  claim script), both on Redis's clock.
"""

from __future__ import annotations

import http.client
import random
import time
from typing import Callable

import orjson

from ops.bench.bench_report import Row, Section
from ops.bench.benchlib import BIN, Bench, percentile, wait_for

#: The list the bare actor pushes its receipt times onto (broker database).
RECEIPTS = "bench:receipts"


def measure(bench: Bench, one: Callable[[str], float]) -> list[float]:
    """One warm-up job (the worker is up), the idle spell, then ``--pickup-jobs`` jobs, paced."""
    args = bench.args
    one("warm")
    time.sleep(args.pickup_idle)
    lo, hi = args.pickup_pause
    latencies = []
    for n in range(args.pickup_jobs):
        latencies.append(one(f"pickup-{n}"))
        time.sleep(random.uniform(lo, hi))
    return latencies


def bare(bench: Bench) -> list[float]:
    from ops.bench import bench_noop

    broker, args = bench.client(1), bench.args
    bench.stack.start("bare", str(BIN / "dramatiq"), "-p", str(args.processes), "-t", str(args.threads),
                      "ops.bench.bench_noop", env={"BENCH_RECEIPTS": RECEIPTS})

    def one(name: str) -> float:
        sent = time.time()
        bench_noop.noop.send(name)
        receipt = broker.blpop([RECEIPTS], timeout=30)
        if receipt is None:
            raise SystemExit(f"bench: the bare worker did not run {name} in 30 s")
        return float(receipt[1]) - sent

    try:
        return measure(bench, one)
    finally:
        bench.stack.stop("bare")


def reckon(bench: Bench) -> list[float]:
    from pipeline.settings import Settings
    from pipeline.state.store import open_store
    from pipeline.state.tenants import create_key, create_tenant

    args, store = bench.args, open_store(Settings.from_env(bench.env))
    create_tenant(store.redis, "pickup", 10**12)
    key = create_key(store.redis, "pickup")
    port = bench.start_web("web", "api.app:create_app()")
    bench.stack.start("worker", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                      "-p", str(args.processes), "-t", str(args.threads))
    workflow = {"3": {"class_type": "KSampler", "inputs": {"text": "x" * args.workflow_bytes}}}
    body = orjson.dumps({"kind": "image", "workflow": workflow, "outputs": 1})

    def one(name: str) -> float:
        # a connection per job: gunicorn closes one idle for longer than its keepalive (2 s)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/jobs", body, {"Authorization": f"Bearer {key}", "Idempotency-Key": name,
                                                "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        if resp.status != 202:
            raise SystemExit(f"bench: admission answered {resp.status}")
        job_id = resp.headers["Location"].rsplit("/", 1)[1]
        wait_for(lambda: (store.job(job_id) or {}).get("state") in ("completed", "failed", "cancelled"),
                 what=f"bench: job {name} did not finish in 30 s")
        claimed = store.attempts(job_id)[0]["started_at"]
        return (int(claimed) - int(store.job(job_id)["created_at"])) / 1000

    try:
        return measure(bench, one)
    finally:
        bench.stack.stop("web", "worker")


def run(bench: Bench) -> Section:
    args = bench.args
    sides = {"bare": bare(bench), "reckon": reckon(bench)}
    ms = {side: [lat * 1000 for lat in latencies] for side, latencies in sides.items()}
    p99 = percentile(ms["reckon"], 99)
    lo, hi = args.pickup_pause
    return Section(
        f"pickup: {args.pickup_jobs} jobs one at a time on an idle stack, workers -p {args.processes} "
        f"-t {args.threads}",
        notes=[f"after {args.pickup_idle:g} s idle; each job after the previous finished and {lo:g}-{hi:g} s more",
               "bare: send -> actor runs (host clock); reckon: created_at -> claimed (Redis's clock, ms)"],
        rows=[
            Row("pickup p50, ms", percentile(ms["bare"], 50), percentile(ms["reckon"], 50)),
            Row("pickup p99, ms", percentile(ms["bare"], 99), p99, "<= 100 ms", p99 <= 100),
            Row("pickup max, ms", max(ms["bare"]), max(ms["reckon"])),
        ])
