"""How fairly the fleet is shared, for operators: each backlogged tenant's cost served against its
weighted fair share over a window (the largest and the smallest ratio per class, no tenant named:
``reckon_fair_share_ratio``), and the tenants with the most queued cost (``reckon status``, ``/ui``).

A claim adds the job's cost (its reserved price times its outputs, the cost its finish tag counts)
to ``served:<class>:<tenant>`` in its shard's fleet hash (lua/claim.lua). The sweeper samples those
counters and who waits parked, and compares two samples a window apart (``publish``)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.state import keys
from pipeline.state.store import Store

CLASSES = ("interactive", "batch")
#: Queued jobs read per shard for the queued-cost view (the first in dispatch order); beyond, the figures say "at least".
MAX_QUEUED_READ = 10_000


def tenant_of(job_id: str) -> str:
    """A job id is ``<tenant>.<random>``."""
    return job_id.rsplit(".", 1)[0]


@dataclass
class Sample:
    """Cost served so far per (class, tenant), who waits parked per class, and their weights."""

    served: Counter[tuple[str, str]] = field(default_factory=Counter)
    backlogged: dict[str, set[str]] = field(default_factory=lambda: {cls: set() for cls in CLASSES})
    weights: dict[str, float] = field(default_factory=dict)


def sample(store: Store) -> Sample:
    """Read every shard's served counters and parked jobs: O(tenants served + jobs parked)."""
    taken = Sample()
    for shard in keys.shards():
        for name, value in store.redis.hscan_iter(shard.fleet, match="served:*", count=1000):
            _, cls, tenant = name.split(":", 2)
            taken.served[(cls, tenant)] += int(value)
        for job_id, score in store.redis.zrange(shard.parked, 0, -1, withscores=True):
            cls = "interactive" if 0 <= score < keys.BATCH_RANK else "batch"  # below 0: batch moved up
            taken.backlogged[cls].add(tenant_of(job_id))
    tenants = sorted(set().union(*taken.backlogged.values()))
    pipe = store.redis.pipeline(transaction=False)
    for tenant in tenants:
        pipe.hget(keys.TenantKeys(tenant).limits, "weight")
    for tenant, weight in zip(tenants, pipe.execute(), strict=True):
        taken.weights[tenant] = float(weight) if weight else 1.0
    return taken


def shares(before: Sample, after: Sample) -> dict[str, tuple[float, float]]:
    """Per class, the smallest and the largest ratio of cost served to weighted fair share among the
    tenants parked at both samples (waiting throughout, roughly); a class with fewer than two such
    tenants, or nothing served between, has no figure."""
    figures = {}
    for cls in CLASSES:
        tenants = sorted(before.backlogged[cls] & after.backlogged[cls])
        served = {t: after.served[(cls, t)] - before.served[(cls, t)] for t in tenants}
        total, weight = sum(served.values()), sum(after.weights.get(t, 1.0) for t in tenants)
        if len(tenants) < 2 or total <= 0:
            continue
        ratios = [served[t] / after.weights.get(t, 1.0) / (total / weight) for t in tenants]
        figures[cls] = (min(ratios), max(ratios))
    return figures


def publish(store: Store, figures: dict[str, tuple[float, float]], at_ms: int) -> None:
    """Write the latest figures (``keys.FAIRNESS``) for /metrics; a class without one loses its old one."""
    mapping: dict[str, Any] = {"at": at_ms}
    for cls, (low, high) in figures.items():
        mapping[f"min:{cls}"], mapping[f"max:{cls}"] = round(low, 4), round(high, 4)
    pipe = store.redis.pipeline(transaction=True)
    pipe.delete(keys.FAIRNESS)
    pipe.hset(keys.FAIRNESS, mapping=mapping)
    pipe.execute()


def read(store: Store) -> dict[str, tuple[float, float]]:
    """The published figures: class -> (smallest, largest) ratio."""
    raw = store.redis.hgetall(keys.FAIRNESS)
    return {cls: (float(raw[f"min:{cls}"]), float(raw[f"max:{cls}"])) for cls in CLASSES if f"min:{cls}" in raw}


def most_queued_cost(store: Store, top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` tenants by cost queued (reserved price times outputs of each queued job), with their
    queued jobs: reads each queued job's record (pipelined; up to MAX_QUEUED_READ per shard), so it is
    for operators' views, not for a scrape."""
    cost: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    partial = False
    for shard in keys.shards():
        ids = store.redis.zrange(shard.queue, 0, MAX_QUEUED_READ - 1)
        partial = partial or len(ids) == MAX_QUEUED_READ
        pipe = store.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.JobKeys(job_id).record, ["price", "outputs_requested"])
        for job_id, (price, outputs) in zip(ids, pipe.execute(), strict=True):
            tenant = tenant_of(job_id)
            jobs[tenant] += 1
            cost[tenant] += int(price or 0) * int(outputs or 1)
    ranked = sorted(cost, key=lambda t: (-cost[t], t))[:top]
    return [{"tenant": t, "jobs": jobs[t], "cost": cost[t], "at_least": partial} for t in ranked]


#: How long the queued-cost view is reused (s): the status page polls every few seconds.
VIEW_SECONDS = 30.0
_views: dict[int, tuple[float, list[dict[str, Any]]]] = {}


def view(store: Store, *, fresh: bool = False) -> dict[str, Any]:
    """The operators' fairness view (``reckon status``, ``/ui``): the tenants with the most queued cost
    (read at most every VIEW_SECONDS per store, unless ``fresh``) and the latest published shares."""
    at, queued = _views.get(id(store), (float("-inf"), []))
    if fresh or time.monotonic() - at >= VIEW_SECONDS:
        queued = most_queued_cost(store)
        _views[id(store)] = (time.monotonic(), queued)
    return {"most_queued": queued,
            "shares": {cls: {"min": low, "max": high} for cls, (low, high) in read(store).items()}}
