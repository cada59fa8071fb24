"""The whole stack with its state on a real three-primary Redis Cluster (the broker on one
redis-server): jobs run while their tenant's slot moves to another primary, and nothing is lost
or paid twice."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from pipeline.keys import TenantKeys
from pipeline.status import audit
from pipeline.store import Store
from pipeline.tenants import create_key, create_tenant
from tests import cluster
from tests.conftest import REDIS_URL, wait_until
from tests.faults.conftest import Stack
from tests.faults.test_crashes import BODY, finished

JOBS = 24


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_jobs_run_while_their_slot_moves_to_another_primary(redis_cluster: cluster.Cluster, store: Store,
                                                            shards: int, tmp_path: Path) -> None:
    redis.Redis.from_url(REDIS_URL[:-1] + "1").flushdb()  # the broker's database, on the one server
    create_tenant(store.redis, "acme", 100_000)
    auth = {"Authorization": f"Bearer {create_key(store.redis, 'acme')}"}
    stack = Stack(tmp_path, RECKON_REDIS_CLUSTER=redis_cluster.spec, RECKON_SHARDS=str(shards))
    try:
        stack.start_provider(delay=0.1)
        stack.start_web()
        stack.start_worker()
        stack.start_sweeper()
        accepted: dict[str, str] = {}
        refused: list[int] = []

        def client() -> None:  # a client retries each intent with its key until it is accepted
            for n in range(JOBS):
                while True:
                    status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth, **{"Idempotency-Key": f"k{n}"})
                    if status == 202:
                        accepted[f"k{n}"] = headers["location"].rsplit("/", 1)[1]
                        break
                    refused.append(status)

        submitting = threading.Thread(target=client)
        submitting.start()
        wait_until(lambda: len(accepted) >= JOBS // 3, timeout=30)
        slot = key_slot(f"{{s{TenantKeys('acme').shard.n}}}".encode())
        source = cluster.owner_of(redis_cluster, slot)
        target = next(port for port in redis_cluster.ports if port != source)
        moved = cluster.move_slot(redis_cluster, slot, target)
        submitting.join(timeout=60)

        assert cluster.owner_of(redis_cluster, slot) == target and moved > 0
        assert set(accepted) == {f"k{n}" for n in range(JOBS)} and len(set(accepted.values())) == JOBS
        wait_until(lambda: all(finished(store, job_id) for job_id in accepted.values()), timeout=60)
        assert {store.job(job_id)["state"] for job_id in accepted.values()} == {"completed"}
        charges = stack.charges()
        assert len(charges["charges"]) == JOBS  # one provider execution per job: none paid twice
        paid = charges["total_units"]
        assert paid == JOBS * 20 and store.ledger("acme") == {
            "allowance": 100_000, "reserved": 0, "uncertain": 0, "settled": paid, "available": 100_000 - paid}
        assert audit(store.redis, ["acme"]) == []  # the shard's figures agree with its jobs
        assert set(refused) <= {503}  # a moving slot may refuse an admission for a moment, never 500
        print(f"slot {slot} moved ({moved} keys) with {len(accepted)} jobs admitted around it; refusals {refused}")
    finally:
        stack.stop()


def test_a_primary_killed_under_load_loses_no_acknowledged_job(redis_server: str, tmp_path: Path) -> None:
    """Three primaries with two replicas each (so a promoted replica still has one to confirm its
    writes); every durable write waits for one replica (RECKON_REPLICAS_TO_ACK=1); the primary of the
    tenant's shard is SIGKILLed while jobs run."""
    redis.Redis.from_url(REDIS_URL[:-1] + "1").flushdb()
    nodes = cluster.start(tmp_path / "cluster", replicas=2)
    client = nodes.client()
    try:
        store = Store(client, shards=cluster.SHARDS)
        create_tenant(client, "acme", 100_000)
        auth = {"Authorization": f"Bearer {create_key(client, 'acme')}"}
        stack = Stack(tmp_path, RECKON_REDIS_CLUSTER=nodes.spec, RECKON_SHARDS=str(cluster.SHARDS),
                      RECKON_REPLICAS_TO_ACK="1", RECKON_ACK_TIMEOUT_MS="1000")
        try:
            stack.start_provider(delay=0.1)
            stack.start_web()
            stack.start_worker()
            stack.start_sweeper()
            accepted: dict[str, str] = {}
            acked_at: list[float] = []
            refused: list[int] = []

            def submit() -> None:
                for n in range(JOBS):
                    while True:
                        status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth,
                                                       **{"Idempotency-Key": f"k{n}"})
                        if status == 202:
                            accepted[f"k{n}"] = headers["location"].rsplit("/", 1)[1]
                            acked_at.append(time.monotonic())
                            break
                        refused.append(status)
                        time.sleep(0.2)

            submitting = threading.Thread(target=submit)
            submitting.start()
            wait_until(lambda: len(accepted) >= JOBS // 3, timeout=30)
            slot = key_slot(f"{{s{TenantKeys('acme').shard.n}}}".encode())
            primary = cluster.owner_of(nodes, slot)
            killed_at = time.monotonic()
            nodes.node(primary).kill()
            wait_until(lambda: cluster.owner_of(nodes, slot, default=primary) != primary, timeout=30)
            promoted_after = time.monotonic() - killed_at
            submitting.join(timeout=90)

            assert set(accepted) == {f"k{n}" for n in range(JOBS)} and len(set(accepted.values())) == JOBS
            wait_until(lambda: all(finished(store, job_id) for job_id in accepted.values()), timeout=90)
            assert {store.job(job_id)["state"] for job_id in accepted.values()} == {"completed"}
            charges = stack.charges()
            assert len(charges["charges"]) == JOBS  # one provider execution per acknowledged job
            paid = charges["total_units"]
            assert paid == JOBS * 20 and store.ledger("acme") == {
                "allowance": 100_000, "reserved": 0, "uncertain": 0, "settled": paid, "available": 100_000 - paid}
            assert audit(client, ["acme"]) == []
            assert set(refused) <= {503}
            gaps = [b - a for a, b in zip(acked_at, acked_at[1:], strict=False)]
            print(f"primary killed: replica promoted after {promoted_after:.1f} s; longest pause between 202s "
                  f"{max(gaps):.1f} s; {len(refused)} answers 503 meanwhile")
        finally:
            stack.stop()
    finally:
        client.close()
        nodes.stop()
