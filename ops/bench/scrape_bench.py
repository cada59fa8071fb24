#!/usr/bin/env python3
"""Cost of a /metrics scrape and of `reckon status`: 1 tenant with 1 job against 10,000 tenants with 100,000 jobs.

Run: ``.venv/bin/python ops/bench/scrape_bench.py [--tenants 10000 --jobs 100000]``. Starts a private
redis-server on a free loopback port (AOF off), admits the jobs through the real admission
script (a third of them then claimed, some finished), and renders the exposition in process; the
commands a scrape costs are read from Redis's own counter.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import orjson
from prometheus_client import generate_latest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from api.metrics import Metrics
from ops.bench.benchlib import private_store  # noqa: E402
from pipeline.settings import Settings
from pipeline.state.status import snapshot
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}
CAPS = {"comfyui": 10**9}


def commands(store: Store) -> int:
    return int(store.redis.info("stats")["total_commands_processed"])


def measure(store: Store, render) -> tuple[float, int]:
    """Median ms of 20 renders, and the commands of one (minus the INFO that reads the counter)."""
    times = []
    for _ in range(20):
        before, started = commands(store), time.perf_counter()
        render()
        times.append((time.perf_counter() - started) * 1000)
        cost = commands(store) - before - 1
    return round(statistics.median(times), 2), cost


def scenario(store: Store, tenants: int, jobs: int) -> dict[str, object]:
    store.redis.flushall()
    for n in range(tenants):
        create_tenant(store.redis, f"t{n}", 10**9)
    settings = dataclasses.replace(Settings(), queue_cap_interactive=10**9, queue_cap_batch=10**9,
                                   interactive_target_seconds=10**6)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    for n in range(jobs):
        priority = ("interactive", "batch")[n % 2]
        job_id = admitter.submit(f"t{n % tenants}", f"k{n}", BODY | {"priority": priority}).job_id
        if n % 3 == 0:
            claim = store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"op{n}", servers=CAPS)
            if claim and n % 6 == 0:
                store.finish(claim, "failed", error_class="provider_error")
    registry = Metrics(store, CAPS).registry
    scrape_ms, scrape_commands = measure(store, lambda: generate_latest(registry))
    status_ms, status_commands = measure(store, lambda: snapshot(store, CAPS))
    return {"tenants": tenants, "jobs": jobs, "scrape_ms_median": scrape_ms, "scrape_commands": scrape_commands,
            "status_ms_median": status_ms, "status_commands": status_commands}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    with private_store() as store:
        for tenants, jobs in ((1, 1), (args.tenants, args.jobs)):
            print(orjson.dumps(scenario(store, tenants, jobs)).decode(), flush=True)


if __name__ == "__main__":
    main()
