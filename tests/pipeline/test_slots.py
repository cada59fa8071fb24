"""A server's cap across shards (pipeline/state/slots.py) on a real redis-server with two shards:
each step that takes, keeps or gives back a slot, and each crash window between a slot and a claim."""

from __future__ import annotations

from typing import Iterator

import pytest

from pipeline.errors import DispatchPaused
from pipeline.state import keys, slots
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant
from tests.pipeline.conftest import WORKFLOW

CAPS = {"a": 1, "b": 2}


@pytest.fixture
def two(redis_client) -> Iterator[Store]:
    store = Store(redis_client, shards=2)
    yield store
    keys.use_shards(1)


def admit(store: Store, key: str) -> str:
    from pipeline.settings import Settings
    from pipeline.state.submit import Admitter

    if not store.redis.exists(keys.TenantKeys("acme").ledger):
        create_tenant(store.redis, "acme", 10**6)
    admitter = Admitter(store, lambda job_id, priority: None, Settings.from_env())
    return admitter.submit("acme", key, {"kind": "image", "workflow": WORKFLOW, "outputs": 1}).job_id


def claim(store: Store, job_id: str):
    return store.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{job_id}", servers=CAPS)


def held(store: Store) -> dict[str, list[str]]:
    return {name: store.redis.zrange(keys.server_slots(name), 0, -1) for name in CAPS}


def test_claims_take_a_server_slot_and_a_full_fleet_parks(two: Store) -> None:
    jobs = [admit(two, f"k{n}") for n in range(4)]
    claims = [claim(two, job_id) for job_id in jobs]
    assert [c is not None for c in claims] == [True, True, True, False]
    assert sorted(sum(held(two).values(), [])) == sorted(jobs[:3])
    assert {name: len(ids) for name, ids in held(two).items()} == {"a": 1, "b": 2}
    assert two.redis.zrange(keys.JobKeys(jobs[3]).shard.parked, 0, -1) == [jobs[3]]
    two.finish(claims[0], "cancelled", reason="cancelled")  # gives back both counts
    assert claims[0].job_id not in sum(held(two).values(), [])


def test_a_duplicate_message_of_a_running_job_leaves_its_slot(two: Store) -> None:
    job_id = admit(two, "k1")
    first = claim(two, job_id)
    assert claim(two, job_id) is None  # the message again: not queued, no slot taken or given
    assert held(two)[first.server] == [job_id]


def test_a_slot_taken_for_a_claim_that_never_came_is_freed_after_the_grace(two: Store, monkeypatch) -> None:
    job_id = admit(two, "k1")
    assert two.slots.take("a", 1, job_id) == 1  # the worker died here (after_slot_taken)
    assert two.slots.keep(CAPS) == 0 and held(two)["a"] == [job_id]  # within the grace: it may still claim
    monkeypatch.setattr(slots, "GRACE_MS", 0)
    assert two.slots.keep(CAPS) == 1 and held(two)["a"] == []
    running = claim(two, job_id)  # the message again: the job runs, with a slot of its own
    assert running is not None and held(two)[running.server] == [job_id]
    assert two.slots.keep(CAPS) == 0 and held(two)[running.server] == [job_id]  # held: renewed, not freed


def test_a_claim_whose_slot_was_freed_meanwhile_sends_nothing(two: Store, monkeypatch) -> None:
    job_id = admit(two, "k1")
    running = claim(two, job_id)
    two.slots.give(running.server, job_id)  # as the sweeper would for a claim later than the grace
    with pytest.raises(DispatchPaused):
        two.mark_submit(running, epoch="", lease_ms=60_000)
    assert two.job(job_id)["submitted"] == "0"


def test_unpark_calls_no_more_than_the_slots_free_across_shards(two: Store) -> None:
    other = "zeta"  # a tenant in the other shard holds both of b's slots and a's
    create_tenant(two.redis, other, 10**6)
    assert keys.TenantKeys(other).shard != keys.TenantKeys("acme").shard
    for n, name in enumerate(["a", "b", "b"]):
        assert two.slots.take(name, CAPS[name], f"{other}.{n:020d}") == 1
    parked = [admit(two, f"k{n}") for n in range(2)]
    assert [claim(two, job_id) for job_id in parked] == [None, None]
    shard = keys.TenantKeys("acme").shard
    assert two.unpark(shard, CAPS) == []  # its own shard's counts say 3 free; there are none
    two.slots.give("b", f"{other}.{1:020d}")
    assert two.unpark(shard, CAPS) == parked[:1]


def test_a_lapsed_lease_frees_its_slot_for_the_next_take(two: Store) -> None:
    key = keys.server_slots("a")
    assert two.scripts("slot-take", [key], [1, "acme.gone", 1]) == [0, 1]  # a 1 ms lease
    assert two.scripts("slot-take", [key], [1, "acme.gone", 60_000]) == [0, 2]  # held: renewed, one slot
    assert two.scripts("slot-take", [key], [1, "acme.next", 60_000]) == [0, 0]  # full
    two.redis.zadd(key, {"acme.gone": 1})  # its lease lapsed long ago
    assert two.scripts("slot-take", [key], [1, "acme.next", 60_000]) == [0, 1]
    assert two.redis.zrange(key, 0, -1) == ["acme.next"]


def test_a_stopped_server_is_not_tried_and_the_job_takes_another(two: Store) -> None:
    job_id = admit(two, "k1")
    two.block_provider("a", "dispatch_paused")
    two.slots.turn = 1  # the next claim would start at a
    running = claim(two, job_id)
    assert running is not None and running.server == "b" and held(two) == {"a": [], "b": [job_id]}
