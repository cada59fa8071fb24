"""The whole stack with its state on a real Redis Cluster (the broker on one redis-server): jobs
run while their tenant's slot moves to another primary, and while its primary is SIGKILLed; nothing
acknowledged is lost and nothing is paid twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from pipeline.state.keys import TenantKeys
from pipeline.state.status import audit
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests import cluster
from tests.conftest import REDIS_URL, wait_until
from tests.faults.conftest import Stack
from tests.faults.test_crashes import BODY, finished

JOBS = 24
ALLOWANCE = 100_000


class Load:
    """A client submitting JOBS intents, each retried with its key until it is accepted (202)."""

    def __init__(self, stack: Stack, store: Store) -> None:
        redis.Redis.from_url(REDIS_URL[:-1] + "1").flushdb()  # the broker's database, on the one server
        create_tenant(store.redis, "acme", ALLOWANCE)
        self.auth = {"Authorization": f"Bearer {create_key(store.redis, 'acme')}"}
        self.stack, self.store = stack, store
        self.accepted: dict[str, str] = {}
        self.acked_at: list[float] = []
        self.refused: list[int] = []
        self.thread = threading.Thread(target=self._submit)

    def start(self) -> int:
        """Start the stack and the client; once a third is accepted, the slot of the tenant's shard."""
        self.stack.start_provider(delay=0.1)
        self.stack.start_web()
        self.stack.start_worker()
        self.stack.start_sweeper()
        self.thread.start()
        wait_until(lambda: len(self.accepted) >= JOBS // 3, timeout=30)
        return key_slot(f"{{s{TenantKeys('acme').shard.n}}}".encode())

    def _submit(self) -> None:
        for n in range(JOBS):
            while True:
                status, headers, _ = self.stack.api("POST", "/v1/jobs", BODY, **self.auth,
                                                    **{"Idempotency-Key": f"k{n}"})
                if status == 202:
                    self.accepted[f"k{n}"] = headers["location"].rsplit("/", 1)[1]
                    self.acked_at.append(time.monotonic())
                    break
                self.refused.append(status)
                time.sleep(0.2)

    def check(self) -> float:
        """Every intent accepted once, every job completed, one provider execution each, the ledger
        and the shard's figures exact, nothing but 503 meanwhile; the longest pause between 202s (s)."""
        self.thread.join(timeout=90)
        jobs = set(self.accepted.values())
        assert set(self.accepted) == {f"k{n}" for n in range(JOBS)} and len(jobs) == JOBS
        wait_until(lambda: all(finished(self.store, job_id) for job_id in jobs), timeout=90)
        assert {self.store.job(job_id)["state"] for job_id in jobs} == {"completed"}
        charges = self.stack.charges()
        assert len(charges["charges"]) == JOBS  # one provider execution per job: none paid twice
        paid = charges["total_units"]
        assert paid == JOBS * 20 and self.store.ledger("acme") == {
            "allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": paid, "available": ALLOWANCE - paid}
        assert audit(self.store.redis, ["acme"]) == []
        # A moving or failing primary may refuse for a moment (503), and a retry whose first request was
        # written but not yet confirmed published is told it is in progress (409) until the sweeper
        # publishes it: never a 500.
        assert set(self.refused) <= {409, 503}
        return max(b - a for a, b in zip(self.acked_at, self.acked_at[1:], strict=False))


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_jobs_run_while_their_slot_moves_to_another_primary(redis_cluster: cluster.Cluster, store: Store,
                                                            shards: int, tmp_path: Path) -> None:
    stack = Stack(tmp_path, RECKON_REDIS_CLUSTER=redis_cluster.spec, RECKON_SHARDS=str(shards))
    try:
        load = Load(stack, store)
        slot = load.start()
        source = cluster.owner_of(redis_cluster, slot)
        target = next(port for port in redis_cluster.ports if port != source)
        moved = cluster.move_slot(redis_cluster, slot, target)
        pause = load.check()
        assert cluster.owner_of(redis_cluster, slot) == target and moved > 0
        cluster.move_slot(redis_cluster, slot, source)  # the session's cluster as the other tests know it
        print(f"slot {slot} moved ({moved} keys) while {JOBS} jobs were admitted and ran; longest pause "
              f"between 202s {pause:.1f} s; {len(load.refused)} refusals")
    finally:
        stack.stop(graceful=False)


def test_a_primary_killed_under_load_loses_no_acknowledged_job(redis_server: str, tmp_path: Path) -> None:
    """Three primaries with two replicas each (so a promoted replica still has one to confirm its
    writes); every durable write waits for one replica (RECKON_REPLICAS_TO_ACK=1); the primary of the
    tenant's shard is SIGKILLed while jobs run."""
    nodes = cluster.start(tmp_path / "cluster", replicas=2)
    client: Any = nodes.client()
    stack = Stack(tmp_path, RECKON_REDIS_CLUSTER=nodes.spec, RECKON_SHARDS=str(cluster.SHARDS),
                  RECKON_REPLICAS_TO_ACK="1", RECKON_ACK_TIMEOUT_MS="1000")
    try:
        load = Load(stack, Store(client, shards=cluster.SHARDS))
        slot = load.start()
        primary = cluster.owner_of(nodes, slot)
        killed_at = time.monotonic()
        nodes.node(primary).kill()
        wait_until(lambda: cluster.owner_of(nodes, slot, default=primary) != primary, timeout=30)
        promoted_after = time.monotonic() - killed_at
        pause = load.check()
        print(f"primary killed: replica promoted after {promoted_after:.1f} s; longest pause between 202s "
              f"{pause:.1f} s; {len(load.refused)} refusals meanwhile ({sorted(set(load.refused))})")
    finally:
        stack.stop(graceful=False)
        client.close()
        nodes.stop()
