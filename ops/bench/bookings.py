#!/usr/bin/env python3
"""What usage records and adjustments cost in Redis: bytes per finished job's booking fields, bytes and
commands per adjustment, the commands of a page of records, the commands and seconds of reconciling a
statement of one line per job, and the bytes of the adjustments' ids left once their jobs are purged.

Run: ``.venv/bin/python ops/bench/bookings.py --jobs 1000``.
Starts a private redis-server (ops/redis.conf, AOF off) on a free loopback port; admits, charges and
completes ``--jobs`` jobs through the Store (each settled and packed), books one adjustment against each,
reconciles a statement of one line per job (one line differing) against the books, purges every job
past its retention, and prints bytes (``MEMORY USAGE`` summed over every key, every element sampled)
and commands (``INFO commandstats``, those a script calls included, FCALL itself left out).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import private_store  # noqa: E402
from ops.bench.capacity import key_bytes  # noqa: E402
from pipeline.operate import invoice  # noqa: E402
from pipeline.state import records  # noqa: E402
from pipeline.state.keys import JobKeys, TenantKeys  # noqa: E402
from pipeline.state.store import Store  # noqa: E402
from pipeline.state.tenants import create_tenant  # noqa: E402

T0 = 1_796_000_000_000


def commands(store: Store, call: Callable[[], Any]) -> int:
    store.redis.config_resetstat()
    call()
    stats = store.redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_config|resetstat"))


def finish_one(store: Store, job_id: str, n: int) -> None:
    ceiling = 30
    record = {"id": job_id, "tenant": "acme", "state": "queued", "kind": "image", "priority": "batch",
              "outputs_requested": 1, "price": 10, "ceiling": ceiling, "reserved": ceiling, "charged": 0,
              "uncertain": 0, "settled": 0, "per_attempt": 10, "attempts_allowed": 3, "attempt_count": 0,
              "lease_gen": 0, "deadline_s": 10**9, "deadline": 10**13, "created_at": T0, "updated_at": T0,
              "idem_key": job_id}
    store.admit("acme", job_id, job_id, fingerprint="f", ceiling=ceiling, fields={k: str(v) for k, v in record.items()},
                workflow=b"{}", status=202, now_ms=T0, idem_ttl_s=60, outbox_delay_ms=0)
    claim = store.claim(job_id, worker="w", now_ms=T0 + n, lease_ms=1000, operation_id=f"prompt-{n:032x}",
                        servers={"gpu-a": 10**6})
    assert claim is not None
    store.mark_submit(claim, now_ms=T0 + n, epoch="e", lease_ms=1000)
    store.charge(claim, 10)
    store.store_output(claim, 0, {"sha256": "a" * 64, "bytes": 1000, "content_type": "image/png"}, now_ms=T0 + n)
    store.finish(claim, "completed", now_ms=T0 + n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    n = parser.parse_args().jobs
    with private_store(ROOT / "ops" / "redis.conf") as store:
        create_tenant(store.redis, "acme", 10**12)
        jobs = [f"acme.{i + 1:020x}" for i in range(n)]
        for i, job_id in enumerate(jobs):
            finish_one(store, job_id, i)
        with_fields = key_bytes(store.redis)
        packed = {job_id: store.redis.hget(JobKeys(job_id).record, "z") for job_id in jobs}
        for job_id, z in packed.items():  # the same packed records without their booking field: what it adds
            cut = z.replace(',"charges":"1 10 gpu-a"', "").replace('"charges":"1 10 gpu-a",', "").replace(
                '{"charges":"1 10 gpu-a"}', "{}")
            assert len(cut) < len(z), z
            store.redis.hset(JobKeys(job_id).record, "z", cut)
        without = key_bytes(store.redis)
        for job_id, z in packed.items():
            store.redis.hset(JobKeys(job_id).record, "z", z)
        spent = commands(store, lambda: [store.adjust(job_id, 3, f"statement-2026-11:prompt-{i:032x}",
                                                      "late GPU seconds", attempt=1, now_ms=T0 + 10**6 + i)
                                         for i, job_id in enumerate(jobs)])
        adjusted = key_bytes(store.redis)
        page = commands(store, lambda: records.page(store.redis, "acme", start_ms=0, end_ms=T0 + 10**7, limit=100))
        statement = "operation_id,units\n" + "".join(f"prompt-{i:032x},{13 + (i == 0)}\n" for i in range(n))
        began = time.perf_counter()
        report: list[invoice.Report] = []
        read = commands(store, lambda: report.append(invoice.compare(
            *invoice.read_statement(statement), invoice.books(store.redis, start_ms=0, end_ms=2**53, server=None))))
        seconds = time.perf_counter() - began
        assert [d["operation_id"] for d in report[0].differ] == [f"prompt-{0:032x}"] and report[0].clean() is False
        t = TenantKeys("acme")
        ids = store.redis.memory_usage(t.bookings, samples=0) + store.redis.memory_usage(t.booking_log, samples=0)
        purged = commands(store, lambda: [store.purge(job_id, retention_ms=0, now_ms=T0 + 10**8) for job_id in jobs])
        assert store.redis.exists(t.bookings, t.booking_log) == 0, "an adjustment's id outlived its job"
        print(f"booking field (charges) on a finished job: {(with_fields - without) / n:.0f} bytes per job")
        print(f"adjustment: {spent / n:.1f} commands, {(adjusted - with_fields) / n:.0f} bytes each "
              f"(its id kept, a job's fields, the log)")
        print(f"a page of 100 records: {page} commands")
        print(f"invoice reconcile, {n} lines against {n} jobs: {read} commands, {seconds:.2f} s")
        print(f"adjustment ids (bookings hash and log): {ids / n:.0f} bytes each; 0 left after the {n} jobs "
              f"were purged ({purged / n:.1f} commands per purge)")


if __name__ == "__main__":
    main()
