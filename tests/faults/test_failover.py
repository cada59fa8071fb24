"""Failover under load: a primary, two replicas and three Sentinels on loopback, the whole stack
(gunicorn, a Dramatiq worker, the watcher, the sweeper, the simulated provider) reaching state and
broker through Sentinel with RECKON_REPLICAS_TO_ACK=1; jobs flow from client threads while the
primary is SIGKILLed and Sentinel promotes a replica.

Two replicas, not one: with one, the promoted replica has none left and every durable write would
answer 503 until an operator brings a replica back (docs/failover.md).
"""

from __future__ import annotations

import threading
import time
import urllib.error
from collections import Counter
from itertools import pairwise
from pathlib import Path

import orjson
import pytest

from ops.soak import soak_check
from pipeline.state import keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.redisconn import connect_url
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until
from tests.faults.conftest import Stack
from tests.replication import RedisProcs

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}
TERMINAL = {"completed", "failed", "cancelled"}


class Load(threading.Thread):
    """Submits jobs one after another, each retried with its own Idempotency-Key until a 202 (503s,
    409s and refused connections included), and keeps when each 202 came."""

    def __init__(self, stack: Stack, api_key: str, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stack, self.auth, self.name_ = stack, {"Authorization": f"Bearer {api_key}"}, name
        self.stop = threading.Event()
        self.accepted: list[tuple[float, str]] = []  # (monotonic time of the 202, job id)
        self.answers: Counter[str] = Counter()  # status, and problem type for a 503

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = f"{self.name_}-{n}"
            while not self.stop.is_set():
                status, headers, body = self._post(key)
                problem = orjson.loads(body)["type"].rsplit(":", 1)[1] if status == 503 else ""
                self.answers[f"{status} {problem}".strip()] += 1
                if status == 202:
                    self.accepted.append((time.monotonic(), headers["location"].rsplit("/", 1)[1]))
                    break
                assert status in (0, 409, 503), status
                time.sleep(0.2)
            time.sleep(0.05)

    def _post(self, key: str) -> tuple[int, dict[str, str], bytes]:
        try:
            return self.stack.api("POST", "/v1/jobs", BODY, timeout=30, **self.auth, **{"Idempotency-Key": key})
        except (urllib.error.URLError, OSError):
            return 0, {}, b""


@pytest.mark.timeout(150)
def test_sigkill_of_the_primary_loses_no_acknowledged_job(tmp_path: Path) -> None:
    procs = RedisProcs(tmp_path)
    stack: Stack | None = None
    loads: list[Load] = []
    try:
        primary = procs.server()
        for _ in range(2):
            procs.server(replica_of=primary)
        procs.sentinels(primary, down_after_ms=1000, failover_timeout_ms=3000)
        client = connect_url(procs.sentinel_url(0))  # the test's own view, through Sentinel as well
        create_tenant(client, "acme", 10**9)
        api_key = create_key(client, "acme")
        stack = Stack(tmp_path, RECKON_REDIS_URL=procs.sentinel_url(0), RECKON_BROKER_URL=procs.sentinel_url(1),
                      RECKON_REPLICAS_TO_ACK="1", RECKON_ACK_TIMEOUT_MS="1000", RECKON_PROVIDER_CAP="4")
        stack.start_provider(delay=0.05)
        stack.start_web()
        stack.start_worker()
        stack.start_sweeper()
        pids = {name: proc.pid for name, proc in stack.procs.items()}
        # every process is past its start-up (which Redis may fail: a supervisor restarts it) before the kill
        wait_until(lambda: client.hget(keys.SWEEPER, "at") and client.exists(keys.watcher_lock("comfyui")), timeout=30)
        loads = [Load(stack, api_key, f"client{i}") for i in range(2)]
        for load in loads:
            load.start()
        wait_until(lambda: sum(len(load.accepted) for load in loads) >= 30, timeout=30)

        killed_at = time.monotonic()
        procs.kill(primary)
        wait_until(lambda: procs.master_port() != primary, timeout=30)
        promoted_s = time.monotonic() - killed_at
        wait_until(lambda: sum(t > killed_at for load in loads for t, _ in load.accepted) >= 30, timeout=60)
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(timeout=40)

        accepted = {job_id for load in loads for _, job_id in load.accepted}
        times = sorted(t for load in loads for t, _ in load.accepted)
        # the longest wait between two 202s that spans part of the failover (kill to promotion)
        pause = max(b - a for a, b in pairwise(times) if b > killed_at and a < killed_at + promoted_s)

        def at_rest() -> bool:
            ids = client.zrange(TenantKeys("acme").jobs, 0, -1)
            states = [client.hget(JobKeys(job_id).record, "state") for job_id in ids]
            return all(state in TERMINAL for state in states)

        wait_until(at_rest, timeout=60, interval=0.5)
        jobs = soak_check.collect(client, ["acme"])
        missing = accepted - set(jobs)
        assert missing == set(), f"acknowledged jobs lost in the failover: {sorted(missing)}"
        assert Counter(jobs[job_id]["record"]["state"] for job_id in accepted) == {"completed": len(accepted)}
        assert soak_check.ledger_problems(*soak_check.snapshot(client, "acme")) == []
        reconciled = sum(any(e["to"] == "reconciling" for e in job["events"]) for job in jobs.values())
        print(f"\nfailover: replica promoted {promoted_s:.2f} s after the SIGKILL; admissions paused {pause:.2f} s; "
              f"{len(accepted)} jobs acknowledged, {reconciled} reconciled after losing their lease; "
              f"answers {dict(sum((load.answers for load in loads), Counter()))}")
        charges = stack.charges()["charges"]
        paid = soak_check.money(jobs, charges, [])
        assert (paid["duplicated"], paid["mismatched"], paid["orphan_charges"]) == ([], [], [])
        assert len({c["prompt_id"] for c in charges}) == len(charges)  # no execution paid twice
        ledger = client.hgetall(TenantKeys("acme").ledger)
        assert int(ledger["settled"]) == sum(c["units"] for c in charges)
        assert (int(ledger.get("reserved", 0)), int(ledger.get("uncertain", 0))) == (0, 0)
        # the same processes served before and after: reconnecting needed no restart
        assert {name: proc.pid for name, proc in stack.procs.items() if proc.poll() is None} == pids
    finally:
        for load in loads:
            load.stop.set()
        if stack is not None:
            stack.stop(graceful=False)
        procs.stop()
