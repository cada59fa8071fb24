"""Fair dispatch between tenants by cost (lua/_slots.lua ``finish_tag``): one server with one slot,
jobs parked behind it, and the order in which the freed slot calls them, through the real admission
and claim scripts on a real redis-server."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st

from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant, set_limits

SERVERS = {"gpu": 1}
PRICE = 10  # the settings' price per output: a job's cost is PRICE x its outputs


class Fleet:
    """Tenants' jobs admitted, parked behind one busy slot, then dispatched one at a time."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.admitter = Admitter(store, lambda job_id, priority: None, settings)
        self.running: Any = None
        self.sent = 0
        self.owner: dict[str, tuple[str, int]] = {}

    def tenant(self, name: str, weight: float | None = None) -> None:
        create_tenant(self.store.redis, name, 10**9)
        if weight is not None:
            set_limits(self.store.redis, name, weight=weight)

    def submit(self, tenant: str, count: int, *, outputs: int = 1, priority: str = "batch") -> list[str]:
        """``count`` jobs of ``tenant``, each claimed once: the first takes the free slot, the rest park."""
        ids = []
        for _ in range(count):
            self.sent += 1
            body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": outputs,
                    "priority": priority}
            job_id = self.admitter.submit(tenant, f"intent-{self.sent}", body).job_id
            self.owner[job_id] = (tenant, outputs * PRICE)
            claim = self.store.claim(job_id, worker="w", lease_ms=600_000, operation_id=job_id, servers=SERVERS)
            if claim is not None:
                assert self.running is None
                self.running = claim
            ids.append(job_id)
        return ids

    def dispatch(self, n: int, *, batch_wait_ms: int = 3_600_000) -> list[str]:
        """Free the slot ``n`` times; the job each freed slot calls, in order."""
        order = []
        for _ in range(n):
            self.store.finish(self.running, "cancelled", reason="cancelled")
            called = self.store.unpark(keys.ShardKeys(0), SERVERS, batch_wait_ms=batch_wait_ms)
            assert len(called) == 1, called
            job_id = called[0]
            self.running = self.store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"{job_id}-run",
                                            servers=SERVERS)
            assert self.running is not None
            order.append(job_id)
        return order


def test_ten_jobs_after_a_thousand_are_dispatched_among_the_next_twenty(store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 1000)
    late = set(fleet.submit("b", 10))
    order = fleet.dispatch(20)
    assert set(order) >= late
    assert [fleet.owner[j][0] for j in order].count("a") == 10


def test_weights_three_to_one_share_the_cost_three_to_one(store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a", weight=3)
    fleet.tenant("b")
    fleet.submit("a", 400)
    fleet.submit("b", 200)
    order = fleet.dispatch(400)
    for start in range(0, 201, 50):  # every window of 200 dispatches while both wait
        cost = Counter()
        for job_id in order[start:start + 200]:
            tenant, units = fleet.owner[job_id]
            cost[tenant] += units
        assert 2.7 <= cost["a"] / cost["b"] <= 3.3, (start, cost)


@pytest.mark.parametrize(("weights", "outputs", "dispatches"), [
    ((1000, 100), (1, 1), 330),  # steps of 0.1 and 1 tenth: 10 to 1
    ((80, 40), (1, 1), 300),
    ((3, 1), (1, 1), 300),
    ((1000, 1), (16, 1), 640),  # 16-output jobs at 1000 against 1-output ones at 1: 62.5 jobs to 1
    ((0.5, 1), (1, 1), 300),
    ((0.001, 0.002), (1, 1), 300),  # the lowest weights: steps of 100,000 and 50,000 tenths
])
def test_served_cost_follows_the_weights_over_their_whole_range(
        store: Store, settings: Settings, weights: tuple[float, float], outputs: tuple[int, int],
        dispatches: int) -> None:
    """Two tenants waiting throughout: over every window of the dispatches, each one's cost served over its
    weight is within one job of the other's (a job's cost over its tenant's weight, each side: the bound of
    self-clocked fair queueing), so the served cost ratio is the weights' ratio, whatever the weights."""
    fleet = Fleet(store, settings)
    share = weights[0] / outputs[0] / (weights[0] / outputs[0] + weights[1] / outputs[1])  # a's share of jobs
    for name, weight, size, count in (("a", weights[0], outputs[0], share), ("b", weights[1], outputs[1], 1 - share)):
        fleet.tenant(name, weight=weight)
        fleet.submit(name, int(dispatches * count) + 20, outputs=size)
    order = fleet.dispatch(dispatches)
    lead, leads = 0.0, [0.0]  # a's cost over its weight less b's, after each dispatch
    for job_id in order:
        tenant, units = fleet.owner[job_id]
        lead += units / weights[0] if tenant == "a" else -units / weights[1]
        leads.append(lead)
    bound = outputs[0] * PRICE / weights[0] + outputs[1] * PRICE / weights[1]
    assert max(leads) - min(leads) <= bound * (1 + 1e-9), (max(leads), min(leads), bound)
    waiting = {fleet.owner[job_id][0] for job_id in store.redis.zrange(keys.ShardKeys(0).parked, 0, -1)}
    assert waiting == {"a", "b"}  # both waited throughout


def test_big_jobs_and_small_jobs_receive_equal_cost_not_equal_counts(store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("big")
    fleet.tenant("small")
    fleet.submit("big", 20, outputs=16)
    fleet.submit("small", 400, outputs=1)
    order = fleet.dispatch(160)
    jobs = Counter(fleet.owner[j][0] for j in order)
    cost = Counter()
    for job_id in order:
        cost[fleet.owner[job_id][0]] += fleet.owner[job_id][1]
    assert abs(cost["big"] - cost["small"]) <= 16 * PRICE, cost
    assert jobs["small"] >= 14 * jobs["big"], jobs


def test_interactive_goes_before_batch_whatever_the_tags(store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 5)
    urgent = fleet.submit("a", 3, priority="interactive")
    fleet.submit("b", 5)
    assert fleet.dispatch(3) == urgent


def test_a_batch_job_past_the_starvation_bound_goes_before_interactive_ones(store: Store, settings: Settings) -> None:
    """Batch waits behind interactive only up to the bound (``batch_wait_ms``): then the oldest batch
    jobs go first, oldest first, ahead of every interactive job, and a claim that finds them parked
    keeps their place; while batch is paused they wait and interactive ones go."""
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 1, priority="interactive")  # takes the slot
    old = fleet.submit("b", 2)
    urgent = fleet.submit("a", 4, priority="interactive")
    assert fleet.dispatch(1) == urgent[:1]  # within the bound: interactive first
    parked = keys.ShardKeys(0).parked
    assert store.redis.zscore(parked, old[0]) >= 10**13
    store.pause_class("batch")
    assert fleet.dispatch(1, batch_wait_ms=0) == urgent[1:2]  # batch paused: not moved, not called
    assert store.redis.zscore(parked, old[0]) >= 10**13
    store.resume_class("batch")
    for job_id in old:  # a duplicate message of each: the claim parks it again, in its moved place
        store.unpark(keys.ShardKeys(0), SERVERS, batch_wait_ms=0)
        assert store.claim(job_id, worker="w2", lease_ms=60_000, operation_id="dup", servers=SERVERS) is None
        assert store.redis.zscore(parked, job_id) < 0
    order = fleet.dispatch(3, batch_wait_ms=0)  # the two old ones first: queued in one ms, either may lead
    assert sorted(order[:2]) == sorted(old) and order[2] == urgent[2]


def test_while_interactive_is_paused_batch_jobs_past_the_bound_go_first(store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 1)  # takes the slot
    first = fleet.submit("b", 1, outputs=16)  # its tag is behind the two that follow
    store.unpark(keys.ShardKeys(0), SERVERS, batch_wait_ms=0)  # moved past the bound
    later = fleet.submit("a", 2)
    store.pause_class("interactive")
    fleet.submit("a", 2, priority="interactive")  # parked by the pause
    assert fleet.dispatch(3) == [*first, *later]


WEIGHTS = [0.001, 0.002, 0.5, 1, 2, 3, 7.3, 80, 999.9, 1000]  # across the range `reckon tenant set` accepts
#: Virtual time (cost units over weight) a batch score cannot tell apart: 2^-9 of a tenth near 1e13, so
#: two tags closer than that may go either way (lua/_slots.lua ``finish_tag``).
TAG_ULP = 2**-9 / 10


@hypothesis_settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(WEIGHTS), st.integers(1, 8), st.integers(5, 25)), min_size=2, max_size=4))
def test_no_backlogged_tenant_falls_below_its_weighted_share_by_more_than_one_job(
        store: Store, settings: Settings, tenants: list[tuple[float, int, int]]) -> None:
    """Tenants (weight, outputs per job, jobs) all waiting: at every point while every tenant still has
    jobs waiting, each has been served at least its weighted share of the cost less one job's cost (and
    its weight times TAG_ULP, what the score's precision may give away)."""
    store.redis.flushdb()
    fleet = Fleet(store, settings)
    names = [f"t{i}" for i in range(len(tenants))]
    for name, (weight, outputs, count) in zip(names, tenants, strict=True):
        fleet.tenant(name, weight=weight)
        fleet.submit(name, count, outputs=outputs)
    first = fleet.owner[fleet.running.job_id][0]
    left = {name: count for name, (_, _, count) in zip(names, tenants, strict=True)}
    left[first] -= 1
    served = Counter({first: fleet.owner[fleet.running.job_id][1]})
    total_weight = sum(weight for weight, _, _ in tenants)
    biggest = max(outputs for _, outputs, _ in tenants) * PRICE
    while all(left.values()):
        job_id = fleet.dispatch(1)[0]
        tenant, units = fleet.owner[job_id]
        left[tenant] -= 1
        served[tenant] += units
        total = sum(served.values())
        for name, (weight, _, _) in zip(names, tenants, strict=True):
            assert served[name] >= total * weight / total_weight - biggest - weight * TAG_ULP - 1e-9, (
                name, served, tenants)


def test_a_replayed_request_a_duplicate_claim_and_a_lost_call_move_no_tag(store: Store, settings: Settings) -> None:
    """The tag is written by the admission script itself (no step to die between), once per job: a retried
    request replays without a second tag, a message that arrives twice claims nothing, and a parked job
    claimed again keeps its place; only a job that takes a slot moves the virtual time."""
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    running, parked = fleet.submit("a", 2)
    ledger, shard = keys.TenantKeys("a").ledger, keys.ShardKeys(0)
    before = (store.redis.hget(ledger, "vf:batch"), store.redis.hget(shard.fleet, "vt:batch"),
              store.redis.zscore(shard.parked, parked))
    assert before == ("200", "100", 10**13 + 200)  # 1 output x price 10, in tenths; the first took the slot
    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "priority": "batch"}
    replay = fleet.admitter.submit("a", "intent-2", body)
    assert (replay.job_id, replay.replayed) == (parked, True)
    for job_id in (running, parked):  # a duplicate message of each
        assert store.claim(job_id, worker="w2", lease_ms=60_000, operation_id="dup", servers=SERVERS) is None
    after = (store.redis.hget(ledger, "vf:batch"), store.redis.hget(shard.fleet, "vt:batch"),
             store.redis.zscore(shard.parked, parked))
    assert after == before
    assert fleet.dispatch(1) == [parked] and store.redis.hget(shard.fleet, "vt:batch") == "200"
