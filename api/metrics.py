"""Prometheus exposition of reckon's Redis state, read fresh on every scrape.

``/metrics`` is public, so it names no tenant: jobs, ledgers and indexes are summed over all
tenants. Per-tenant figures are for operators (``reckon status``) and each tenant (``GET /v1/usage``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline import keys
from pipeline.keys import TenantKeys
from pipeline.store import Store

INDEXES = ("queued", "leases", "retry", "reconcile", "review", "dead", "outbox")
LEDGER_KINDS = ("allowance", "reserved", "uncertain", "settled")
#: Tenants read per pipelined round trip while a scrape sums their figures.
TENANTS_PER_ROUND_TRIP = 500


@dataclass
class Totals:
    """Figures summed over every tenant: no tenant is named in the public exposition."""

    jobs: Counter[str] = field(default_factory=Counter)
    ledger: Counter[str] = field(default_factory=Counter)
    indexes: Counter[str] = field(default_factory=Counter)


def totals(client: Any, tenants: list[str]) -> Totals:
    """Sum each tenant's counts, ledger and index sizes (9 commands per tenant, pipelined)."""
    summed = Totals()
    for start in range(0, len(tenants), TENANTS_PER_ROUND_TRIP):
        pipe = client.pipeline(transaction=False)
        for tenant in tenants[start:start + TENANTS_PER_ROUND_TRIP]:
            t = TenantKeys(tenant)
            pipe.hgetall(t.counts)
            pipe.hmget(t.ledger, LEDGER_KINDS)
            for index in INDEXES:
                pipe.zcard(getattr(t, index))
        replies = pipe.execute()
        step = 2 + len(INDEXES)
        for at in range(0, len(replies), step):
            counts, ledger, sizes = replies[at], replies[at + 1], replies[at + 2:at + step]
            summed.jobs.update({state: int(n) for state, n in counts.items()})
            figures = {kind: int(units or 0) for kind, units in zip(LEDGER_KINDS, ledger, strict=True)}
            figures["available"] = figures["allowance"] - sum(figures[kind] for kind in LEDGER_KINDS[1:])
            summed.ledger.update(figures)
            summed.indexes.update(dict(zip(INDEXES, sizes, strict=True)))
    return summed


class StateCollector:
    def __init__(self, store: Store, provider: str = "comfyui") -> None:
        self.store, self.provider = store, provider

    def collect(self) -> Iterator[Metric]:
        summed = totals(self.store.redis, self.store.tenants())
        jobs = GaugeMetricFamily("reckon_jobs", "Jobs by state, all tenants.", labels=["state"])
        for state, count in sorted(summed.jobs.items()):
            jobs.add_metric([state], count)
        ledger = GaugeMetricFamily("reckon_ledger_units", "Ledgers in cost units, summed over all tenants.",
                                   labels=["kind"])
        for kind in (*LEDGER_KINDS, "available"):
            ledger.add_metric([kind], summed.ledger[kind])
        depth = GaugeMetricFamily("reckon_index_jobs", "Jobs in each due-time index (outbox, retry, dead, ...).",
                                  labels=["index"])
        for index in INDEXES:
            depth.add_metric([index], summed.indexes[index])
        stats = self.store.redis.hgetall(keys.STATS)
        stale = CounterMetricFamily("reckon_stale_writes_rejected", "Writes refused for a stale lease generation.")
        stale.add_metric([], int(stats.get("stale_writes_rejected", 0)))
        blocked = GaugeMetricFamily("reckon_provider_blocked",
                                    "1 while dispatch to a provider is stopped (credentials, pause).",
                                    labels=["provider"])
        blocked.add_metric([self.provider], int(self.store.provider_block(self.provider) is not None))
        yield from (jobs, ledger, depth, stale, blocked)


class Metrics:
    public = True

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(store))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.registry)
