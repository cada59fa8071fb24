"""The drain phase of ops/bench/bench.py, and the admission and drain functions the growth phase reuses.

Admission in process: the baseline sends N messages to a no-op actor (``ops/bench/bench_noop.py``); reckon
admits N jobs through ``Admitter.submit`` (idempotency, reservation, publication). Drain: a worker
(``-p``/``-t``, the same budget for both) starts on the backlog; timed from its first fetch until
every message is acked (baseline) or every job has finished and settled (reckon: claim, submit mark,
a null provider that completes at once, one output of ``--output-bytes`` stored with its sha256 in
``RECKON_BLOB_DIR``, charge, finish).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import redis

from ops.bench.bench_report import Row, Section
from ops.bench.benchlib import BIN, Bench, group_cpu, redis_cpu, shard_totals, wait_for

#: A drain that finishes nothing for this long has stalled: the run stops, saying so.
STALL_SECONDS = 60


@dataclass
class Phase:
    """One measured phase: jobs, wall seconds, Redis CPU seconds, other CPU seconds."""

    jobs: int
    seconds: float
    redis_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def redis_us(self) -> float:
        return self.redis_s / self.jobs * 1e6

    @property
    def machine_us(self) -> float:
        return (self.redis_s + self.cpu_s) / self.jobs * 1e6


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(client: redis.Redis, jobs: int, cpu: Callable[[], float], body: Callable[[], Any]) -> Phase:
    """Run ``body`` and measure it."""
    cpu0, redis0, t0 = cpu(), redis_cpu(client), time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    return Phase(jobs, seconds, redis_cpu(client) - redis0, cpu() - cpu0)


def drain(bench: Bench, name: str, queue: str, jobs: int, finished: Callable[[], int], skip: int = 0) -> Phase:
    """Time the worker ``name`` from its first fetch from the broker's ``queue`` (a list of ``jobs``
    messages), or from when ``skip`` jobs have finished (its warm-up left out), until ``finished()``
    reaches ``jobs``; its process group's CPU and Redis's over the span, for the jobs in it."""
    broker, pgid = bench.client(1), bench.stack.procs[name].pid
    wait_for(lambda: broker.llen(queue) < jobs, timeout=120, what=f"bench: {name} took nothing in 120 s",
             interval=0.002)
    if skip:
        wait_for(lambda: finished() >= skip, timeout=STALL_SECONDS, what=f"bench: {name} stalled", interval=0.005)
    cpu0, redis0, t0 = group_cpu(pgid), redis_cpu(broker), time.perf_counter()
    done, progress_at = finished(), t0
    while done < jobs:
        time.sleep(0.005)
        now, count = time.perf_counter(), finished()
        if count > done:
            done, progress_at = count, now
        elif now - progress_at > STALL_SECONDS:
            raise SystemExit(f"bench: {name} finished {done} of {jobs} and nothing more in {STALL_SECONDS} s")
    seconds = time.perf_counter() - t0
    return Phase(jobs - skip, seconds, redis_cpu(broker) - redis0, group_cpu(pgid) - cpu0)


def baseline(bench: Bench) -> tuple[Phase, Phase]:
    """The bare Dramatiq no-op: send, then drain."""
    from ops.bench import bench_noop

    jobs, args, broker = bench.args.jobs, bench.args, bench.client(1)
    send = timed(broker, jobs, self_cpu, lambda: [bench_noop.noop.send(f"job-{i}") for i in range(jobs)])
    bench.stack.start("bare", str(BIN / "dramatiq"), "-p", str(args.processes), "-t", str(args.threads),
                      "ops.bench.bench_noop")
    queue = f"bare:{bench_noop.QUEUE}"
    run = drain(bench, "bare", queue, jobs, lambda: jobs - broker.llen(queue) - broker.hlen(f"{queue}.msgs"))
    bench.stack.stop("bare")
    bench_noop.broker.close()
    return send, run


class Reckon:
    """reckon's side, in process: its store and admitter over the bench's environment."""

    def __init__(self, bench: Bench) -> None:
        from pipeline.settings import Settings
        from pipeline.state.store import open_store
        from pipeline.state.submit import Admitter
        from pipeline.work.broker import Publisher, build_broker

        self.bench = bench
        self.settings = Settings.from_env(bench.env)
        self.store = open_store(self.settings)
        self.admitter = Admitter(self.store, Publisher(build_broker(self.settings)), self.settings)
        workflow = {"3": {"class_type": "KSampler", "inputs": {"text": "x" * bench.args.workflow_bytes}}}
        self.body = {"kind": "image", "outputs": 1, "workflow": workflow}

    def create_tenants(self, tenants: list[str]) -> None:
        from pipeline.state.tenants import create_tenant

        for tenant in tenants:
            create_tenant(self.store.redis, tenant, 10**12)

    def admit(self, tenants: list[str], jobs: int, tag: str) -> Phase:
        """Admit ``jobs`` jobs round-robin over ``tenants`` (intent keys ``<tag>-<n>``), measured."""
        def admit_all() -> None:
            for i in range(jobs):
                self.admitter.submit(tenants[i % len(tenants)], f"{tag}-{i}", self.body)

        return timed(self.store.redis, jobs, self_cpu, admit_all)

    def finished(self) -> dict[str, int]:
        """Interactive jobs completed and failed so far, from the shards' figures (one round trip)."""
        completed, failed = shard_totals(self.store.redis, self.settings.shards, "jobs:interactive:completed",
                                         "jobs:interactive:failed")
        return {"completed": completed, "failed": failed}

    def drain(self, jobs: int, skip: int = 0) -> Phase:
        """Start a worker on the backlog of ``jobs`` jobs, time it until all have finished (leaving
        out the first ``skip``), stop it."""
        args, before = self.bench.args, sum(self.finished().values())
        self.bench.stack.start("worker", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                               "-p", str(args.processes), "-t", str(args.threads))
        run = drain(self.bench, "worker", "dramatiq:reckon-interactive", jobs,
                    lambda: sum(self.finished().values()) - before, skip)
        self.bench.stack.stop("worker")
        return run

    def books(self, tenants: list[str]) -> dict[str, int]:
        """Jobs completed and failed, money settled and still reserved, blobs stored."""
        from pipeline.state.keys import TenantKeys

        pipe = self.store.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hmget(TenantKeys(tenant).ledger, "settled", "reserved")
        ledgers = pipe.execute()
        blobs = Path(self.bench.env["RECKON_BLOB_DIR"]).glob("*/*/*")
        return self.finished() | {"settled": sum(int(s or 0) for s, _ in ledgers),
                                  "reserved": sum(int(r or 0) for _, r in ledgers),
                                  "blobs": sum(1 for path in blobs if not path.name.startswith("."))}


def run(bench: Bench) -> Section:
    """Both sides in turn on a flushed Redis; the drain section of the report."""
    args = bench.args
    send, bare = baseline(bench)
    bench.client().flushall()
    side = Reckon(bench)
    tenants = [f"t{n}" for n in range(args.tenants)]
    side.create_tenants(tenants)
    admission = side.admit(tenants, args.jobs, "intent")
    run = side.drain(args.jobs)
    books = side.books(tenants)
    if books["completed"] != args.jobs or books["reserved"]:
        raise SystemExit(f"bench: reckon's books after the drain are wrong: {books}")
    total_redis = admission.redis_us + run.redis_us
    total_machine, bare_machine = admission.machine_us + run.machine_us, send.machine_us + bare.machine_us
    return Section(
        f"drain: a backlog of {args.jobs:,} jobs, workers -p {args.processes} -t {args.threads}",
        notes=[f"reckon: {args.tenants} tenants, {args.workflow_bytes} B workflow, one {args.output_bytes} B output",
               f"reckon's books: {books['completed']:,} completed, {books['failed']} failed, {books['settled']:,} "
               f"settled, {books['reserved']} still reserved, {books['blobs']:,} blobs stored"],
        rows=[
            Row("drain, jobs/s", bare.rate, run.rate, ">= 0.5x", run.rate >= 0.5 * bare.rate),
            Row("Redis CPU per job, drain, µs", bare.redis_us, run.redis_us),
            Row("Redis CPU per job, admission, µs", send.redis_us, admission.redis_us),
            Row("Redis CPU per job, admission to settled, µs", send.redis_us + bare.redis_us, total_redis,
                "<= 150 µs", total_redis <= 150),
            Row("machine CPU per job, drain, µs", bare.machine_us, run.machine_us),
            Row("machine CPU per job, admission to settled, µs", bare_machine, total_machine, "<= 2x",
                total_machine <= 2 * bare_machine),
            Row("admission calls/s, in process", send.rate, admission.rate),
        ])
