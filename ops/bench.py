#!/usr/bin/env python3
"""reckon's full-guarantee pipeline against a bare Dramatiq no-op, side by side, in one run.

Run: ``make bench`` (``.venv/bin/python ops/bench.py --jobs 10000``).
On 127.0.0.1 free ports it starts one redis-server (ops/redis.conf with AOF off: database 0 the
state, database 1 the broker, as deployed), and for each side in turn:

- admission in process: the baseline sends N messages to a no-op actor (``ops/bench_noop.py``);
  reckon admits N jobs through ``Admitter.submit`` (idempotency, reservation, publication);
- drain: a worker (``-p``/``-t``, the same budget for both) starts on the backlog; timed from its
  first fetch until every message is acked (baseline) or every job completed and settled (reckon:
  claim, submit mark, a null provider that completes at once, one output of ``--output-bytes``
  stored with its sha256 in ``RECKON_BLOB_DIR``, charge, finish).

Figures per job: Redis CPU (INFO cpu, the server's own), machine CPU (the measuring process or the
worker's process group, plus Redis) and rates; each reckon figure is followed by its ratio to the
baseline measured in the same run. Compare ratios, not absolute figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from ops.benchlib import Stack, free_port, group_cpu, redis_cpu, wait_for  # noqa: E402


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


def timed(client: redis.Redis, jobs: int, cpu: Callable[[], float], body: Callable[[], None]) -> Phase:
    """Run ``body`` and measure it."""
    cpu0, redis0, t0 = cpu(), redis_cpu(client), time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    return Phase(jobs, seconds, redis_cpu(client) - redis0, cpu() - cpu0)


def drain(client: redis.Redis, stack: Stack, name: str, queue: str, jobs: int, done: Callable[[], bool]) -> Phase:
    """Time the worker ``name`` from its first fetch from ``queue`` (a list of ``jobs`` messages)
    until ``done``; its process group's CPU and Redis's over the same span."""
    pgid = stack.procs[name].pid
    wait_for(lambda: client.llen(queue) < jobs, timeout=120)
    cpu0, redis0, t0 = group_cpu(pgid), redis_cpu(client), time.perf_counter()
    while not done():
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    return Phase(jobs, seconds, redis_cpu(client) - redis0, group_cpu(pgid) - cpu0)


def baseline(args: argparse.Namespace, stack: Stack, url: str) -> tuple[Phase, Phase]:
    """The bare Dramatiq no-op: send, then drain."""
    os.environ["BENCH_BROKER_URL"] = stack.env["BENCH_BROKER_URL"] = url
    from ops import bench_noop

    client = redis.Redis.from_url(url)
    send = timed(client, args.jobs, self_cpu, lambda: [bench_noop.noop.send(f"job-{i}") for i in range(args.jobs)])
    stack.start("bare", str(BIN / "dramatiq"), "-p", str(args.processes), "-t", str(args.threads), "ops.bench_noop")
    queue = f"bare:{bench_noop.QUEUE}"
    run = drain(client, stack, "bare", queue, args.jobs,
                lambda: client.llen(queue) == 0 and client.hlen(f"{queue}.msgs") == 0)
    stack.stop("bare")
    bench_noop.broker.close()
    return send, run


def reckon(args: argparse.Namespace, stack: Stack, env: dict[str, str]) -> tuple[Phase, Phase, dict[str, int]]:
    """reckon: admit in process, then drain with the null provider; and the books after."""
    from pipeline.broker import Publisher, build_broker
    from pipeline.jobs import Admitter
    from pipeline.keys import TenantKeys
    from pipeline.settings import Settings
    from pipeline.store import open_store
    from pipeline.tenants import create_tenant

    settings = Settings.from_env(env)
    store = open_store(settings)
    tenants = [f"t{n}" for n in range(args.tenants)]
    for tenant in tenants:
        create_tenant(store.redis, tenant, 10**12)
    admitter = Admitter(store, Publisher(build_broker(settings)), settings)
    body = {"kind": "image", "outputs": 1,
            "workflow": {"3": {"class_type": "KSampler", "inputs": {"text": "x" * args.workflow_bytes}}}}

    def admit() -> None:
        for i in range(args.jobs):
            admitter.submit(tenants[i % len(tenants)], f"intent-{i}", body)

    def completed() -> int:
        pipe = store.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hget(TenantKeys(tenant).counts, "completed")
        return sum(int(n or 0) for n in pipe.execute())

    state = store.redis
    admission = timed(state, args.jobs, self_cpu, admit)
    stack.start("worker", str(BIN / "python"), "-m", "pipeline.worker", "pipeline.actors",
                "-p", str(args.processes), "-t", str(args.threads))
    run = drain(state, stack, "worker", "dramatiq:reckon-interactive", args.jobs,
                lambda: completed() == args.jobs)
    stack.stop("worker")
    books = {"completed": completed(), "settled": 0, "reserved": 0}
    for tenant in tenants:
        ledger = state.hgetall(TenantKeys(tenant).ledger)
        books["settled"] += int(ledger["settled"])
        books["reserved"] += int(ledger["reserved"])
    books["blobs"] = sum(1 for path in Path(env["RECKON_BLOB_DIR"]).glob("*/*/*") if not path.name.startswith("."))
    return admission, run, books


def report(rows: list[tuple[str, float, float, bool]]) -> None:
    """(measure, baseline, reckon, higher is better) -> a table with reckon's ratio to the baseline."""
    print(f"{'measure':<44} {'bare Dramatiq':>14} {'reckon':>10} {'ratio':>7}")
    for name, bare, ours, _ in rows:
        print(f"{name:<44} {bare:>14,.0f} {ours:>10,.0f} {ours / bare:>6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="backlog per side")
    parser.add_argument("--processes", type=int, default=2, help="worker processes, both sides")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker process, both sides")
    parser.add_argument("--tenants", type=int, default=10, help="reckon's jobs go round-robin to these tenants")
    parser.add_argument("--workflow-bytes", type=int, default=1024, help="size of each job's workflow")
    parser.add_argument("--output-bytes", type=int, default=1024, help="size of each job's one output")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="reckon-bench-") as tmp:
        work = Path(tmp)
        port = free_port()
        env = os.environ | {
            "RECKON_REDIS_URL": f"redis://127.0.0.1:{port}/0", "RECKON_BROKER_URL": f"redis://127.0.0.1:{port}/1",
            "RECKON_PROVIDER_URL": f"null://?bytes={args.output_bytes}", "RECKON_WATCH": "0",
            "RECKON_BLOB_DIR": str(work / "blobs"), "RECKON_PROVIDER_CAP": str(args.processes * args.threads),
            "RECKON_QUEUE_CAP_INTERACTIVE": str(10 * args.jobs), "RECKON_INTERACTIVE_TARGET_SECONDS": str(10**6),
        }
        stack = Stack(env)
        try:
            stack.start("redis", "redis-server", "ops/redis.conf", "--port", str(port), "--dir", str(work),
                        "--appendonly", "no", "--save", "")
            client = redis.Redis(port=port)
            wait_for(client.ping)
            send, bare = baseline(args, stack, f"redis://127.0.0.1:{port}/1")
            client.flushall()
            admission, run, books = reckon(args, stack, env)
        finally:
            stack.stop()
    print(f"{args.jobs} jobs per side; workers -p {args.processes} -t {args.threads}; reckon: {args.tenants} tenants, "
          f"{args.workflow_bytes} B workflow, one {args.output_bytes} B output; Redis 7, AOF off")
    print(f"reckon's books: {books['completed']} completed, {books['settled']} settled, {books['reserved']} "
          f"still reserved, {books['blobs']} blobs stored")
    report([
        ("drain, jobs/s", bare.rate, run.rate, True),
        ("Redis CPU per job, drain, µs", bare.redis_us, run.redis_us, False),
        ("Redis CPU per job, admission, µs", send.redis_us, admission.redis_us, False),
        ("Redis CPU per job, admission to settled, µs", send.redis_us + bare.redis_us,
         admission.redis_us + run.redis_us, False),
        ("machine CPU per job, drain, µs", bare.machine_us, run.machine_us, False),
        ("machine CPU per job, admission to settled, µs", send.machine_us + bare.machine_us,
         admission.machine_us + run.machine_us, False),
        ("admission calls/s, in process", send.rate, admission.rate, True),
    ])


if __name__ == "__main__":
    main()
