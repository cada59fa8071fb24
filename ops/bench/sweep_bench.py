#!/usr/bin/env python3
"""Cost of a sweeper pass: idle, and with due work, at 10 and at 10,000 tenants.

Run: ``.venv/bin/python ops/bench/sweep_bench.py``. Starts a private redis-server on a free
loopback port (AOF off), creates the tenants, and times sweeper passes in process; the
commands a pass costs are read from Redis's own counter (script-internal commands included).
Due work: jobs admitted with nobody to claim them, seen after the redelivery window.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import private_store  # noqa: E402
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.sweeper import Sweeper

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}


def commands(store: Store) -> int:
    return int(store.redis.info("stats")["total_commands_processed"])


def timed_pass(store: Store, sweeper: Sweeper) -> tuple[float, int, dict[str, int]]:
    before = commands(store)
    started = time.perf_counter()
    moved = sweeper.sweep_once()
    elapsed = time.perf_counter() - started
    return elapsed * 1000, commands(store) - before - 1, dict(moved)  # minus the INFO itself


def scenario(store: Store, tenants: int, due_jobs: int) -> dict[str, object]:
    store.redis.flushall()
    for n in range(tenants):
        create_tenant(store.redis, f"t{n}", 10**9)
    settings = dataclasses.replace(Settings(), outbox_grace_seconds=60.0)  # nothing comes due while idle
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    for n in range(due_jobs):  # 10 jobs a tenant (fewer tenants: more each)
        admitter.submit(f"t{n // 10 % tenants}", f"k{n}", BODY)
    idle = Sweeper(store, lambda job_id, route: None, settings)
    idle_runs = [timed_pass(store, idle) for _ in range(20)]
    ahead = Sweeper(store, lambda job_id, route: None, settings, clock=lambda: time.time() + 61)
    busy_ms, busy_commands, moved = timed_pass(store, ahead)
    return {"tenants": tenants, "due_jobs": due_jobs,
            "idle_pass_ms_median": round(statistics.median(r[0] for r in idle_runs), 3),
            "idle_pass_commands": idle_runs[-1][1],
            "busy_pass_ms": round(busy_ms, 1), "busy_pass_commands": busy_commands, "moved": moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--due", type=int, default=100, help="jobs due in the busy pass")
    args = parser.parse_args()
    with private_store() as store:
        for tenants in (10, 10_000):
            print(orjson.dumps(scenario(store, tenants, args.due)).decode(), flush=True)


if __name__ == "__main__":
    main()
