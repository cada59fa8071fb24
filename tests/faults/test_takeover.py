"""Ownership with real processes: a worker whose clock is a minute behind, a worker frozen
(SIGSTOP) past its lease and then resumed, and a worker killed while it held prefetched
messages. Charges come from the simulated provider's ledger, the ground truth of what was paid.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from pipeline.state.keys import ShardKeys
from tests.conftest import wait_until
from tests.faults.conftest import BIN
from tests.faults.test_crashes import finished, setup, submit

#: The figures of the one shard these stacks run with.
STATS = ShardKeys(0).stats

DRAMATIQ = (str(BIN / "dramatiq"), "pipeline.work.actors", "--processes", "1", "--threads", "2")


def test_a_worker_whose_clock_runs_a_minute_behind_keeps_its_lease(stack, redis_client, store) -> None:
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.fail("faketime is not installed (make test installs it)")
    auth = setup(stack, redis_client)
    stack.start_provider(delay=1.5)  # longer than nothing, shorter than the 2 s lease
    stack.start_web()
    stack.start("worker", faketime, "-f", "-60s", *DRAMATIQ)
    stack.start("watcher", faketime, "-f", "-60s", str(BIN / "python"), "-m", "pipeline.work.watcher")
    stack.start_sweeper()
    job_id = submit(stack, auth)
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "completed"]  # never taken over
    assert [a["state"] for a in store.attempts(job_id)] == ["completed"]
    assert len(stack.charges()["charges"]) == 1
    assert store.redis.hget(STATS, "stale_writes_rejected") is None
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}


def test_a_worker_frozen_past_its_lease_is_fenced_out_when_it_wakes(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider(delay=4.0)  # longer than the 2 s lease
    stack.start_web()
    stack.env["RECKON_WATCH"] = "0"  # it waits for the prompt itself, holding the job
    stack.start("frozen", *DRAMATIQ)
    stack.start_watcher()
    stack.start_sweeper()
    job_id = submit(stack, auth)
    wait_until(lambda: stack.sim_running(), timeout=20)  # the prompt is at the provider, not just marked
    frozen = stack.procs["frozen"].pid
    os.killpg(frozen, signal.SIGSTOP)  # the prompt is at the provider; its worker stops reporting
    try:
        stack.start("worker", *DRAMATIQ)  # reconciles once the lease has expired
        wait_until(lambda: finished(store, job_id), timeout=40)
    finally:
        os.killpg(frozen, signal.SIGCONT)
    # Awake again, the old worker still believes it owns the job: every write it tries is refused.
    wait_until(lambda: int(store.redis.hget(STATS, "stale_writes_rejected") or 0) >= 1, timeout=20)
    time.sleep(1.0)  # let it try whatever else it would write
    job = store.job(job_id)
    assert (job["state"], job["attempt_count"]) == ("completed", "1")
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert [(a["state"], a.get("reconciled")) for a in store.attempts(job_id)] == [("completed", True)]
    assert len(stack.charges()["charges"]) == 1 and stack.charges()["total_units"] == 20
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}


def test_jobs_held_by_a_killed_worker_run_within_the_redelivery_window(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider()
    stack.start_web()
    stack.start("worker", *DRAMATIQ, pause_at="before_claim")
    stack.start_watcher()
    stack.start_sweeper()
    jobs = [submit(stack, auth, key=f"prefetched-{n}") for n in range(3)]
    stack.kill_when_paused("worker")  # its messages sit in a dead consumer's unacked set
    assert {store.job(job_id)["state"] for job_id in jobs} == {"queued"}
    killed = time.monotonic()
    stack.start("worker", *DRAMATIQ)
    wait_until(lambda: all(finished(store, job_id) for job_id in jobs), timeout=30)
    # Dramatiq alone hands such messages back only after its 60 s heartbeat timeout.
    assert time.monotonic() - killed < 15
    assert {store.job(job_id)["state"] for job_id in jobs} == {"completed"}
    assert len(stack.charges()["charges"]) == 3
    assert store.ledger("acme")["settled"] == 60 and store.ledger("acme")["reserved"] == 0
