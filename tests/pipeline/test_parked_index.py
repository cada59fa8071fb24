"""One server's backlog does not hold another server's free slot, however long (lua/_waiting.lua): the
parked jobs are indexed by the servers that can run them, so an unpark finds the best job a free server
can run and a claim counts only the parked jobs that could take its servers' free slots. Servers a
(sdxl only) and b (flux only), cap 1 each; the real admission, claim, finish and unpark scripts on a
real redis-server, with a backlog beyond the 2,048 parked jobs an unpark used to read."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.settings import Settings
from pipeline.state import keys, offers
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from tests.pipeline.test_capabilities import FLUX, NODES, SDXL, body, offer, workflow

CAPS = {"a": 1, "b": 1}
BACKLOG = 2_100  # parked for a, ahead of the job that b can run


class Backlog:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        create_tenant(store.redis, "acme", 10**9)
        offers.write(store.redis, "a", offer(NODES, SDXL), 1)
        offers.write(store.redis, "b", offer(NODES, FLUX), 1)
        providers = "a=http://127.0.0.1:9;cap=1;price=10,b=http://127.0.0.1:9;cap=1;price=10"
        self.admitter = Admitter(store, lambda job_id, priority: None,
                                 dataclasses.replace(settings, providers=providers))
        self.sent = 0

    def submit(self, graph: dict[str, Any]) -> str:
        self.sent += 1
        return self.admitter.submit("acme", f"k{self.sent}", body(graph, priority="batch")).job_id

    def claim(self, job_id: str) -> Any:
        return self.store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"op-{job_id}-{self.sent}",
                                servers=CAPS)

    def fill(self) -> tuple[Any, Any]:
        """a and b each run a job; BACKLOG jobs only a can run park behind a's."""
        on_a, on_b = self.claim(self.submit(workflow("sdxl.safetensors"))), self.claim(
            self.submit(workflow("flux.safetensors")))
        assert (on_a.server, on_b.server) == ("a", "b")
        for _ in range(BACKLOG):
            assert self.claim(self.submit(workflow("sdxl.safetensors"))) is None
        assert self.store.redis.zcard(keys.ShardKeys(0).parked) == BACKLOG
        return on_a, on_b


@pytest.mark.parametrize("graph", [workflow("flux.safetensors"), {"3": {"class_type": "KSampler", "inputs": {}}}],
                         ids=["only-b", "any-server"])
def test_a_freed_slot_calls_the_job_its_server_can_run_behind_another_servers_backlog(
        store: Store, settings: Settings, graph: dict[str, Any]) -> None:
    backlog = Backlog(store, settings)
    on_a, on_b = backlog.fill()
    late = backlog.submit(graph)
    assert backlog.claim(late) is None  # b is full too: it parks, last in rank
    store.finish(on_b, "cancelled", reason="cancelled")
    assert store.unpark(keys.ShardKeys(0), CAPS) == [late]  # before: nothing called, b idle until its deadline
    assert backlog.claim(late).server == "b"
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # a is full, b taken: nobody else called
    store.finish(on_a, "cancelled", reason="cancelled")
    assert len(store.unpark(keys.ShardKeys(0), CAPS)) == 1  # and a's backlog still goes to a, best first


def test_a_newcomer_takes_a_free_slot_that_no_parked_job_ahead_can_use(store: Store, settings: Settings) -> None:
    backlog = Backlog(store, settings)
    _, on_b = backlog.fill()
    store.finish(on_b, "cancelled", reason="cancelled")
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # b is free, but none of the parked can run there
    late = backlog.claim(backlog.submit(workflow("flux.safetensors")))
    assert late is not None and late.server == "b"  # before: counted 2,100 ahead of it, parked, never called
    parked = keys.ShardKeys(0)
    assert store.redis.zcard(parked.parked_any) == 0 and store.redis.zcard(parked.parked_on("a")) == BACKLOG
    assert store.redis.zcard(parked.parked_on("b")) == 0  # its entry went with its claim


def test_index_entries_of_jobs_that_left_are_dropped_when_an_unpark_meets_them(store: Store, settings: Settings) -> None:
    backlog = Backlog(store, settings)
    on_a, _ = backlog.fill()
    shard = keys.ShardKeys(0)
    first = store.redis.zrange(shard.parked, 0, 99)
    for job_id in first:  # 100 of the best-ranked leave: cancelled while parked
        store.cancel(job_id)
    assert store.redis.zcard(shard.parked) == BACKLOG - 100 and store.redis.zcard(shard.parked_on("a")) == BACKLOG
    store.finish(on_a, "cancelled", reason="cancelled")
    called = store.unpark(shard, CAPS)
    assert called == [store.redis.zrange(shard.parked, 0, 0)[0]]  # the best still parked
    assert store.redis.zcard(shard.parked_on("a")) == BACKLOG - 100  # the cancelled ones' entries are gone
