"""The order fair dispatch keeps past the batch starvation bound (lua/_slots.lua ``age_batch``) and between tags
that are not whole tenths (``finish_tag``), through the real scripts on a real redis-server: one server with
one slot, as in test_fairness.py."""

from __future__ import annotations

import pytest

from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from tests.pipeline.test_fairness import SERVERS, Fleet

SHARD = keys.ShardKeys(0)
BOUND_MS = 600_000


def _now_ms(store: Store) -> int:
    seconds, micros = store.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("past", ["none", "the backlog", "all"])
def test_a_small_tenants_batch_job_goes_among_the_first_before_and_after_the_bound(
        store: Store, settings: Settings, past: str) -> None:
    """Tenant a queues 60 batch jobs, then b one, then a 5 interactive ones. Within the bound, interactive go
    first, then b's job among the first two of batch; once a's backlog (or all of it and b's job) has waited
    past the bound, batch goes first, b's job among its first two, and a's after it in a's own order, until no
    batch job is left waiting."""
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 1, priority="interactive")  # takes the slot
    backlog = fleet.submit("a", 60)
    small = fleet.submit("b", 1)
    urgent = fleet.submit("a", 5, priority="interactive")
    old = {"none": [], "the backlog": backlog, "all": [*backlog, *small]}[past]
    now = _now_ms(store)
    for job_id in old:  # queued 700 s ago
        store.redis.zadd(SHARD.queue, {job_id: keys.BATCH_RANK + now - 700_000})
    order = fleet.dispatch(66, batch_wait_ms=BOUND_MS)
    if past == "none":
        assert order[:5] == urgent
        assert small[0] in order[5:7]
        return
    assert small[0] in order[:2]
    assert [job_id for job_id in order[:61] if job_id != small[0]] == backlog  # a's in their own order
    assert order[61:] == urgent  # batch went first while a job past the bound waited


def test_moved_jobs_are_topped_up_to_sixteen_in_tag_order_and_a_moved_job_moves_no_others(store: Store) -> None:
    """The parked set itself (no job records: unpark reads none here, the slot being taken): a job past the
    bound that waits in its place moves the batch jobs of lowest tag ahead, to 16 moved in all, each to its
    tag less 1e13 exactly (fractional tags kept); one moved already, or moved by a version before this one
    (scored by when it was queued, less 1e13), moves nothing, and stays ahead of every unmoved job."""
    now = _now_ms(store)
    young = [f"b{i:02}" for i in range(20)]
    tags = {job_id: 100 * (i + 1) + 0.5 for i, job_id in enumerate(young)}
    store.redis.hset(SHARD.fleet, "busy:gpu", 1)  # the one slot is taken: nobody is called
    store.redis.zadd(SHARD.parked, {"old": now - 700_000 - keys.BATCH_RANK, "i": 50,
                                    **{job_id: keys.BATCH_RANK + tag for job_id, tag in tags.items()}})
    store.redis.zadd(SHARD.queue, {"old": keys.BATCH_RANK + now - 700_000, "i": now,
                                   **{job_id: keys.BATCH_RANK + now for job_id in young}})

    def unpark() -> list[str]:
        assert store.unpark(SHARD, SERVERS, batch_wait_ms=BOUND_MS) == []
        return store.redis.zrange(SHARD.parked, 0, -1)

    assert unpark() == ["old", "i", *young]  # the one past the bound was moved already: nothing moves
    store.redis.zadd(SHARD.queue, {"b19": keys.BATCH_RANK + now - 700_000})  # the last in tag order, past it
    assert unpark() == [*young[:15], "old", "i", *young[15:]]  # 15 more: 16 moved
    assert [store.redis.zscore(SHARD.parked, job_id) for job_id in young[:15]] == [
        tags[job_id] - keys.BATCH_RANK for job_id in young[:15]]
    assert unpark() == [*young[:15], "old", "i", *young[15:]]  # 16 moved: none more
    store.redis.zrem(SHARD.parked, "old", *young[:14])  # claimed
    store.redis.zrem(SHARD.queue, "old", *young[:14])
    assert unpark() == [*young[14:], "i"]  # b19 waited unmoved: b15 to b19 moved, in tag order
    store.redis.zadd(SHARD.parked, {"b20": keys.BATCH_RANK + 2100.5})
    store.redis.zadd(SHARD.queue, {"b20": keys.BATCH_RANK + now})
    assert unpark() == [*young[14:], "i", "b20"]  # every job past the bound moved: it moves no others


def test_a_claim_counts_a_better_parked_job_whose_tag_differs_by_less_than_a_tenth(
        store: Store, settings: Settings) -> None:
    """Weights 10 and 9.8: b's job is tagged 110 tenths, then c's 110.2. With the slot free, c's message
    finds b's job parked ahead of it and parks too (its rank is compared with every digit, not the 14 of
    Lua's text), so the freed slot's unpark calls b's job first."""
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b", weight=10)
    fleet.tenant("c", weight=9.8)
    fleet.submit("a", 1)  # takes the slot: the virtual time is 100 tenths
    better = fleet.submit("b", 1)[0]  # parked
    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "priority": "batch"}
    later = fleet.admitter.submit("c", "intent-c", body).job_id
    assert (store.redis.zscore(SHARD.parked, better), store.redis.hget(keys.JobKeys(later).record, "vf")) == (
        keys.BATCH_RANK + 110, repr(100 + 10 * 10 / 9.8))
    store.finish(fleet.running, "cancelled", reason="cancelled")  # the slot is free
    assert store.claim(later, worker="w", lease_ms=60_000, operation_id=later, servers=SERVERS) is None
    assert store.unpark(SHARD, SERVERS, batch_wait_ms=BOUND_MS) == [better]
