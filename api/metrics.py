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
from pipeline.keys import SERVER_BLOCKS, ProviderKeys, TenantKeys
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
    def __init__(self, store: Store, caps: dict[str, int]) -> None:
        self.store, self.caps = store, caps

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
        refused = CounterMetricFamily("reckon_admission_refused", "Admissions refused, by reason.", labels=["reason"])
        for reason in ("max_inflight", "rate"):
            refused.add_metric([reason], int(stats.get(f"admission_refused:{reason}", 0)))
        beat = self.store.redis.hget(keys.SWEEPER, "at")
        sweeper = GaugeMetricFamily("reckon_sweeper_last_pass_age_seconds",
                                    "Seconds since the sweeper's last pass (on Redis's clock); NaN if it never ran.")
        sweeper.add_metric([], (self.store.server_ms() - int(beat)) / 1000 if beat else float("nan"))
        budget = GaugeMetricFamily("reckon_retry_budget_tokens", "Tokens left in the fleet's shared retry budget.")
        tokens = self.store.redis.hget(ProviderKeys("comfyui").budget, "tokens")
        budget.add_metric([], float(tokens) if tokens is not None else float("nan"))
        yield from (jobs, ledger, depth, stale, refused, sweeper, budget, *self._fleet())

    def _fleet(self) -> Iterator[Metric]:
        """Per server: stop marks, slots, whether a watcher holds it; the parked jobs (one HGETALL,
        one ZCARD, one EXISTS per server)."""
        fleet = self.store.fleet(self.caps)
        blocked = GaugeMetricFamily("reckon_provider_blocked", "1 while dispatch to a server is stopped, by reason.",
                                    labels=["provider", "reason"])
        slots = GaugeMetricFamily("reckon_provider_slots", "Dispatch slots of a server: busy and cap.",
                                  labels=["provider", "kind"])
        watched = GaugeMetricFamily("reckon_provider_watched", "Prompts at a server, followed by its watcher.",
                                    labels=["provider"])
        up = GaugeMetricFamily("reckon_watcher_up", "1 while a watcher holds the server's lock.", labels=["provider"])
        for name, view in fleet.items():
            for reason in SERVER_BLOCKS:
                blocked.add_metric([name, reason], int(reason in view["stopped"]))
            slots.add_metric([name, "busy"], view["busy"])
            slots.add_metric([name, "cap"], view["cap"])
            watched.add_metric([name], view["watched"])
            up.add_metric([name], self.store.redis.exists(keys.watcher_lock(name)))
        paused = GaugeMetricFamily("reckon_class_paused", "1 while a workload class is paused.", labels=["class"])
        pauses = self.store.class_pauses()
        for cls in ("interactive", "batch"):
            paused.add_metric([cls], int(cls in pauses))
        parked = GaugeMetricFamily("reckon_parked_jobs", "Queued jobs waiting for a free server slot.")
        parked.add_metric([], self.store.redis.zcard(keys.PARKED))
        yield from (blocked, slots, watched, up, paused, parked)


class Metrics:
    public = True

    def __init__(self, store: Store, caps: dict[str, int]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(store, caps))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.registry)
