"""Prometheus exposition of reckon's Redis state, read fresh on every scrape."""

from __future__ import annotations

from typing import Iterator

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline import keys
from pipeline.keys import TenantKeys
from pipeline.store import Store

INDEXES = ("queued", "leases", "retry", "reconcile", "review", "dead", "outbox")


class StateCollector:
    def __init__(self, store: Store, provider: str = "comfyui") -> None:
        self.store, self.provider = store, provider

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("reckon_jobs", "Jobs by tenant and state.", labels=["tenant", "state"])
        ledger = GaugeMetricFamily("reckon_ledger_units", "Tenant ledger in cost units.", labels=["tenant", "kind"])
        depth = GaugeMetricFamily("reckon_index_jobs", "Jobs in each due-time index (outbox, retry, dead, ...).",
                                  labels=["tenant", "index"])
        for tenant in self.store.tenants():
            for state, count in self.store.state_counts(tenant).items():
                jobs.add_metric([tenant, state], count)
            for kind, units in self.store.ledger(tenant).items():
                ledger.add_metric([tenant, kind], units)
            t = TenantKeys(tenant)
            for index in INDEXES:
                depth.add_metric([tenant, index], self.store.redis.zcard(getattr(t, index)))
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
