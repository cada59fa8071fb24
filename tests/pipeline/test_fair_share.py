"""The operators' fairness figures (pipeline/state/fairness.py): cost served per tenant counted by the
claim, the shares the sweeper publishes for /metrics, and the tenants with the most queued cost in
``reckon status``, on a real redis-server through the real scripts."""

from __future__ import annotations

from collections import Counter

import orjson

from pipeline.operate import cli
from pipeline.settings import Settings
from pipeline.state import fairness, keys
from pipeline.state.store import Store
from pipeline.work.sweeper import FAIR_WINDOW_MS, Sweeper
from tests.pipeline.test_fairness import PRICE, Fleet


def test_claims_count_the_cost_served_and_the_shares_compare_it_with_the_weights(
        store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a", weight=3)
    fleet.tenant("b")
    fleet.submit("a", 100)
    fleet.submit("b", 100, outputs=2)
    before = fairness.sample(store)
    assert before.served == Counter({("batch", "a"): PRICE})  # a's first took the free slot
    assert before.backlogged == {"interactive": set(), "batch": {"a", "b"}}
    assert before.weights == {"a": 3.0, "b": 1.0}
    order = fleet.dispatch(60)
    after = fairness.sample(store)
    count = Counter(fleet.owner[job_id][0] for job_id in order)
    assert after.served[("batch", "a")] == PRICE * (1 + count["a"])
    assert after.served[("batch", "b")] == 2 * PRICE * count["b"]
    low, high = fairness.shares(before, after)["batch"]
    assert 0.9 <= low <= 1.0 <= high <= 1.1, (low, high, count)  # a's cost is 3 x b's, within a job


def test_a_tenant_served_less_than_its_share_shows_in_the_smallest_ratio() -> None:
    before, after = fairness.Sample(), fairness.Sample()
    for sample in (before, after):
        sample.backlogged["batch"] = {"a", "b", "c"}
        sample.weights.update(a=1.0, b=1.0, c=2.0)
    after.served.update({("batch", "a"): 30, ("batch", "b"): 10, ("batch", "c"): 40})
    after.backlogged["interactive"] = {"a"}  # waited at the end only: no figure for the class
    assert fairness.shares(before, after) == {"batch": (0.5, 1.5)}  # fair: 20, 20, 40


def test_the_sweeper_publishes_the_shares_once_a_window_and_metrics_read_them(
        store: Store, settings: Settings) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.submit("a", 30)
    fleet.submit("b", 30)
    sweeper = Sweeper(store, lambda *message: None, settings)
    sweeper.pass_ms = 1_000
    sweeper.measure_fairness()
    assert fairness.read(store) == {}  # one sample: nothing to compare yet
    fleet.dispatch(20)
    sweeper.pass_ms = 1_000 + FAIR_WINDOW_MS - 1
    sweeper.measure_fairness()
    assert fairness.read(store) == {}  # within the window: not sampled again
    sweeper.pass_ms = 1_000 + FAIR_WINDOW_MS
    sweeper.measure_fairness()
    assert fairness.read(store) == {"batch": (1.0, 1.0)}  # they alternate: 10 each
    assert store.redis.hget(keys.FAIRNESS, "at") == str(1_000 + FAIR_WINDOW_MS)


def test_status_lists_the_tenants_with_the_most_queued_cost(store: Store, settings: Settings, capsys) -> None:
    fleet = Fleet(store, settings)
    fleet.tenant("a")
    fleet.tenant("b")
    fleet.tenant("c")
    fleet.submit("a", 40)  # the first runs: 39 queued
    fleet.submit("b", 3, outputs=16)
    fleet.submit("c", 2, priority="interactive")
    assert fairness.most_queued_cost(store, top=2) == [
        {"tenant": "b", "jobs": 3, "cost": 3 * 16 * PRICE, "at_least": False},
        {"tenant": "a", "jobs": 39, "cost": 39 * PRICE, "at_least": False}]
    assert cli.main(["status"], store=store) == 0
    out = capsys.readouterr().out
    assert "tenant b: queued 3 jobs, 480 cost units" in out and "tenant c: queued 2 jobs, 20 cost units" in out
    assert cli.main(["status", "--json"], store=store) == 0
    shown = orjson.loads(capsys.readouterr().out)["fairness"]
    assert [row["tenant"] for row in shown["most_queued"]] == ["b", "a", "c"] and shown["shares"] == {}
