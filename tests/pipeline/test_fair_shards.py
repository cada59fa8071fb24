"""Fair dispatch across shards (pipeline/state/calls.py): one server of cap 1, tenants in different
shards, jobs parked behind it, and the order in which freed slots call them, through the real
admission, claim, finish and unpark scripts and the worker's ``Unpark`` middleware on a real
redis-server. When a message frees nothing anyone can use, the sweeper's pass (every shard's unpark)
stands in for the second a deployment would wait for it."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import dramatiq
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.fleet import Server
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work import actors
from pipeline.work.executor import Executor
from pipeline.work.routing import Unpark
from pipeline.work.sweeper import Sweeper

SERVERS = {"gpu": 1}
BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "priority": "batch"}


@pytest.fixture
def sharded(redis_client: Any, request: pytest.FixtureRequest) -> Iterator[Store]:
    store = Store(redis_client, shards=request.param)
    yield store
    keys.use_shards(1)


class Dispatch:
    """Jobs admitted and claimed once each (the first takes the slot, the rest park), then the slot freed
    one job at a time, each freed slot's calls published by the ``Unpark`` middleware and claimed."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self.admitter = Admitter(store, lambda job_id, priority: None, settings)
        fleet = Fleet([Server(name, "http://sim", cap) for name, cap in SERVERS.items()], lambda s: None)
        executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
        self.published: list[str] = []
        self.unpark = Unpark(lambda: executor, lambda job_id, route: self.published.append(job_id))
        self.running: Any = None
        self.owner: dict[str, str] = {}
        #: Every job that took the slot, in order.
        self.served: list[str] = []
        self.sweeps = 0
        self.sweeper = Sweeper(store, lambda job_id, route: route == "unparked" and self.published.append(job_id),
                               dataclasses.replace(settings, providers="gpu=http://sim;cap=1"))

    def submit(self, tenant: str, count: int) -> list[str]:
        if not self.store.redis.exists(keys.TenantKeys(tenant).ledger):
            create_tenant(self.store.redis, tenant, 10**9)
        ids = []
        for _ in range(count):
            job_id = self.admitter.submit(tenant, f"intent-{len(self.owner)}", BODY).job_id
            self.owner[job_id] = tenant
            claim = self.claim(job_id, "first")
            if claim is not None:
                assert self.running is None
                self.running = claim
                self.served.append(job_id)
            ids.append(job_id)
        return ids

    def claim(self, job_id: str, attempt: str) -> Any:
        return self.store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"{job_id}-{attempt}",
                                servers=SERVERS)

    def dispatch(self, n: int) -> list[str]:
        """Free the slot ``n`` times; the job each freed slot went to, in order."""
        order = []
        for turn in range(n):
            done, self.running = self.running, None
            self.store.finish(done, "cancelled", reason="cancelled")
            self.unpark.after_process_message(actors.broker, dramatiq.Message(
                queue_name="q", actor_name="a", args=(done.job_id,), kwargs={}, options={}))
            while self.running is None:
                for job_id in self.published:  # their messages, in order; a claim without a slot parks again
                    claim = self.claim(job_id, str(turn))
                    if claim is not None:
                        assert self.running is None, "two jobs took a slot of cap 1"
                        self.running = claim
                self.published = []
                if self.running is None:  # nothing called: the sweeper's next pass
                    self.sweeps += 1
                    assert self.sweeps <= n, "a free slot called nobody, pass after pass"
                    self.sweeper.sweep_once()
            order.append(self.running.job_id)
        self.served += order
        return order

    def ahead_of_last(self, tenant: str, of: str) -> int:
        """How many of ``tenant``'s jobs took the slot before the last of ``of``'s."""
        last = max(i for i, job_id in enumerate(self.served) if self.owner[job_id] == of)
        return sum(1 for job_id in self.served[:last] if self.owner[job_id] == tenant)


@pytest.mark.parametrize("sharded", [4], indirect=True)
def test_a_small_tenant_in_another_shard_is_served_in_turn_with_a_big_one(sharded: Store, settings) -> None:
    """big queues 60 jobs, then small 5, each tenant in a shard of its own of four: small's 5 go within the
    first 10 dispatches, the shards taking turns (before the turns: all 60 of big's went ahead of small's last;
    a deployment's sweeper, once a second, let a few through)."""
    assert keys.TenantKeys("big").shard != keys.TenantKeys("small").shard
    dispatch = Dispatch(sharded, settings)
    dispatch.submit("big", 60)
    dispatch.submit("small", 5)
    dispatch.dispatch(64)
    assert dispatch.ahead_of_last("big", "small") == 5  # the shards take turns: big, small, big, small ...
    assert [dispatch.owner[j] for j in dispatch.served[:10]] == ["big", "small"] * 5
    assert sorted(dispatch.owner[j] for j in dispatch.served) == ["big"] * 60 + ["small"] * 5
    assert dispatch.sweeps == 0  # each freed slot called the next job itself
    assert sharded.redis.zcard(keys.server_slots("gpu")) == 1  # the running job's slot, no reservation left


@pytest.mark.parametrize("sharded", [2], indirect=True)
def test_a_tenant_alone_in_its_shard_waits_for_one_slot_not_for_the_other_shards_backlog(
        sharded: Store, settings) -> None:
    """acme (shard 0) queues 40 jobs, then wayne (shard 1) one: wayne's goes at the next freed slot
    (before the turns: after all 40 of acme's)."""
    assert [keys.TenantKeys(t).shard.n for t in ("acme", "wayne")] == [0, 1]
    dispatch = Dispatch(sharded, settings)
    dispatch.submit("acme", 40)
    late = dispatch.submit("wayne", 1)
    dispatch.dispatch(40)
    assert dispatch.ahead_of_last("acme", "wayne") == 1  # the one running when wayne's came
    assert dispatch.served[1] == late[0]
    assert dispatch.sweeps == 0


@pytest.mark.parametrize("sharded", [2], indirect=True)
def test_a_called_jobs_slot_is_not_taken_by_a_newcomer_from_another_shard(sharded: Store, settings) -> None:
    """A call reserves its slot on the server's key (``<job id>/call``): a job of another shard posted
    between the call and the called job's claim parks; the called job takes its slot (before: the
    newcomer took it, and the called job parked again until the sweeper's next pass)."""
    dispatch = Dispatch(sharded, settings)
    dispatch.submit("acme", 2)  # shard 0: one runs, one parks
    dispatch.store.finish(dispatch.running, "cancelled", reason="cancelled")
    dispatch.running = None
    called = sharded.unpark(keys.TenantKeys("acme").shard, SERVERS)
    assert len(called) == 1 and sharded.redis.zrange(keys.server_slots("gpu"), 0, -1) == [f"{called[0]}/call"]
    newcomer = dispatch.submit("wayne", 1)[0]  # shard 1: nothing parked there, the server reserved
    assert dispatch.running is None and sharded.redis.zscore(keys.TenantKeys("wayne").shard.parked, newcomer)
    running = dispatch.claim(called[0], "called")
    assert running is not None and running.server == "gpu"
    assert sharded.redis.zrange(keys.server_slots("gpu"), 0, -1) == [f"{called[0]}/{called[0]}-called"]
    assert sharded.redis.zrange(keys.server_waiting("gpu"), 0, -1) == ["1", "0"]  # wayne's shard next in turn
