#!/usr/bin/env python3
"""Redis memory per finished job, within retention and after it.

Run: ``.venv/bin/python ops/bench/memory.py --jobs 5000 --workflow-bytes 10240``.
Starts a private redis-server (ops/redis.conf, AOF off: memory is what is measured) on a
free loopback port, admits the jobs through the real admission path, runs each through the
real scripts (claim, mark-submit, one progress point, charge, store-output, finish) with ``--outputs`` outputs
(2), as a deployed stack with ``--delay 0`` servers runs them (about one progress point a job), and prints
``used_memory`` per job: after admission (workflow held), once finished (within retention,
idempotency records included), and after the sweeper purged them past their retention. One job runs
the whole path first, uncounted: Redis's first stream entry, first sorted set and the like cost a
few hundred kilobytes once, not per job (300 jobs would each be charged about 900 bytes of them).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import free_port, wait_for  # noqa: E402
from pipeline.settings import Settings
from pipeline.state import progress
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import worker_name
from pipeline.work.sweeper import Sweeper

#: Bytes of ``used_memory`` a finished job may take within retention, its idempotency record included
#: (issue 30; docs/performance.md has the parts and by how much it is missed).
TARGET_FINISHED_BYTES = 1200


def used(store: Store) -> int:
    return int(store.redis.info("memory")["used_memory"])


def run_all(store: Store, job_ids: list[str], outputs: int, first: int = 0) -> None:
    for n, job_id in enumerate(job_ids, start=first):
        claim = store.claim(job_id, worker=worker_name(), lease_ms=30_000, operation_id=str(uuid.uuid4()),
                            servers={"sim": 1000})  # the worker's name and operation id as a worker makes them
        assert claim is not None
        store.mark_submit(claim, epoch="boot", lease_ms=30_000)
        assert progress.record(store.scripts, job_id, claim.attempt, claim.operation_id, "9", 1, 4)
        store.charge(claim, 10)
        for index in range(outputs):
            store.store_output(claim, index, {"sha256": f"{n * 8 + index:064x}", "bytes": 1234,
                                              "content_type": "image/png"})
        store.finish(claim, "completed")


def measure(jobs: int, workflow_bytes: int, tenants: int, outputs: int = 2) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(
            ["redis-server", str(ROOT / "ops/redis.conf"), "--port", str(port), "--dir", workdir,
             "--appendonly", "no", "--save", ""], stdout=subprocess.DEVNULL)
        try:
            store = Store(connect_url(f"redis://127.0.0.1:{port}/0"), idem_ttl_s=3600)  # as the settings below
            wait_for(lambda: store.redis.ping())
            settings = dataclasses.replace(Settings(), retention_seconds=3600, idempotency_ttl_seconds=3600,
                                           queue_cap_interactive=10**9, interactive_target_seconds=10**9)
            for t in range(tenants):
                create_tenant(store.redis, f"t{t}", 10**12)
            admitter = Admitter(store, lambda job_id, priority: None, settings)
            workflow = {"3": {"class_type": "KSampler", "inputs": {"text": "x" * (workflow_bytes - 60)}}}
            assert abs(len(orjson.dumps(workflow)) - workflow_bytes) < 60
            store.scripts.load()  # the script cache is not per job
            warm = admitter.submit("t0", "warm-up", {"kind": "image", "workflow": workflow, "outputs": outputs})
            run_all(store, [warm.job_id], outputs, first=jobs)  # first uses of each kind of key: not per job
            time.sleep(2.5)  # Redis trims the query buffer of a client idle 2 s: the warm-up's is no job's
            base = used(store)
            ids = [admitter.submit(f"t{n % tenants}", f"intent-{n}", {"kind": "image", "workflow": workflow,
                                                                        "outputs": outputs}).job_id
                   for n in range(jobs)]
            admitted = used(store)
            run_all(store, ids, outputs)
            time.sleep(2.5)  # as before the base: this client's buffers trimmed again
            finished = used(store)
            sweeper = Sweeper(store, lambda job_id, route: None, settings,
                              clock=lambda: time.time() + settings.retention_seconds + 1)
            purged = 0
            while True:
                moved = sweeper.sweep_once().get("purged", 0)
                if not moved:
                    break
                purged += moved
            assert purged == jobs + 1, purged
            # Idempotency records expire on their own, after RECKON_IDEMPOTENCY_TTL_SECONDS (1 day,
            # before the 7-day retention ends): let them go as expiry would.
            for key in store.redis.scan_iter(match="reckon:*:idem*", count=1000):
                store.redis.delete(key)
            time.sleep(0.5)  # let Redis's cron shrink the emptied dictionaries
            after = used(store)
            left = store.redis.dbsize()
            return {"bytes_per_job_admitted": round((admitted - base) / jobs),
                    "bytes_per_job_finished": round((finished - base) / jobs),
                    "target_finished": TARGET_FINISHED_BYTES,
                    "target_met": (finished - base) / jobs <= TARGET_FINISHED_BYTES,
                    "bytes_per_job_after_retention": round((after - base) / jobs),
                    "jobs_purged": purged - 1, "keys_left": left}
        finally:
            server.terminate()
            server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workflow-bytes", type=int, default=10240)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--outputs", type=int, default=2)
    args = parser.parse_args()
    print(orjson.dumps(measure(args.jobs, args.workflow_bytes, args.tenants, args.outputs),
                       option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
