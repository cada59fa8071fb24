"""Prometheus exposition of reckon's Redis state, read fresh on every scrape.

Every figure is read from the global keys the scripts keep in step (``pipeline.state.status``), so a
scrape costs the same number of Redis commands with one tenant or ten thousand. ``/metrics`` is
public, so it names no tenant and no job: labels are class, provider, state, error class, reason.
"""

from __future__ import annotations

from typing import Iterator

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from pipeline.state import fairness
from pipeline.state.keys import SERVER_BLOCKS
from pipeline.state.status import BUDGET_PROVIDER, CLASSES, STATES, Figures, read
from pipeline.state.store import Store
from pipeline.webhooks.deliveries import backlog

NAN = float("nan")
#: Reasons admission refuses a request, each counted in ``refused:<reason>`` (docs/api.md "Admission").
REFUSALS = ("max_inflight", "rate", "queue_full", "load_shed", "deadline_infeasible", "insufficient_allowance")
TTC_BOUNDS = ("1", "5", "15", "30", "60", "120", "300", "600", "1800", "3600", "7200", "+Inf")
ATTEMPT_BOUNDS = ("1", "2", "3", "5", "10", "+Inf")


def _gauge(name: str, text: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, labels=labels)


def _histogram(f: Figures, field: str, name: str, text: str, bounds: tuple[str, ...]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text, labels=["class"])
    for cls in CLASSES:
        running, buckets = 0, []
        for le in bounds:
            running += f.number(f"{field}:{cls}:{le}")
            buckets.append((le, running))
        family.add_metric([cls], buckets, sum_value=float(f.stats.get(f"{field}_sum:{cls}", 0)))
    return family


def _prefixed(f: Figures, prefix: str) -> Iterator[tuple[list[str], int]]:
    """Label values and count of every stats field ``<prefix><a>:<b>...``."""
    for field, value in sorted(f.stats.items()):
        if field.startswith(prefix):
            yield field[len(prefix):].split(":"), int(value)


class StateCollector:
    def __init__(self, store: Store, caps: dict[str, int]) -> None:
        self.store, self.caps = store, caps

    def collect(self) -> Iterator[Metric]:
        f = read(self.store, self.caps)
        yield from self._jobs(f)
        yield from self._money_and_counters(f)
        yield from self._fleet(f)
        yield self._shares()
        yield from self._webhooks()

    def _webhooks(self) -> Iterator[Metric]:
        """The webhook backlog (pipeline/webhooks/deliveries.py ``backlog``): four commands per shard."""
        b = backlog(self.store.redis)
        events = _gauge("reckon_webhook_events_waiting", "Webhook events written by state changes and not yet "
                        "fanned out to deliveries (the webhooks process is behind or down when this grows).")
        events.add_metric([], b.events)
        kept = _gauge("reckon_webhook_deliveries_kept", "Webhook deliveries kept: pending, and exhausted ones kept "
                      "for redelivery.")
        kept.add_metric([], b.kept)
        oldest = _gauge("reckon_webhook_oldest_due_seconds", "How long the earliest due webhook endpoint has waited "
                        "past its due time (0: none is late).")
        oldest.add_metric([], b.oldest_due_seconds)
        yield from (events, kept, oldest)

    def _shares(self) -> Metric:
        """The sweeper's last fair-share figures (pipeline/state/fairness.py): no tenant named."""
        shares = _gauge("reckon_fair_share_ratio", "Cost served over weighted fair share in the last minute, the "
                        "smallest (bound=min) and largest (bound=max) among tenants waiting throughout; NaN: "
                        "fewer than two waited.", ["class", "bound"])
        figures = fairness.read(self.store)
        for cls in CLASSES:
            low, high = figures.get(cls, (NAN, NAN))
            shares.add_metric([cls, "min"], low)
            shares.add_metric([cls, "max"], high)
        return shares

    def _jobs(self, f: Figures) -> Iterator[Metric]:
        jobs = _gauge("reckon_jobs", "Jobs per class and state (terminal ones while retained).", ["class", "state"])
        depth = _gauge("reckon_queue_depth", "Queued jobs per class (eligible for dispatch, parked ones too).",
                       ["class"])
        oldest = _gauge("reckon_oldest_eligible_age_seconds", "Age of the oldest queued job (0: none).", ["class"])
        overdue = _gauge("reckon_overdue_jobs", "Unfinished jobs past the deadline promised at admission.", ["class"])
        estimate = _gauge("reckon_service_time_estimate_seconds",
                          "Moving estimate of the time a job holds a dispatch slot (NaN: no completion yet).",
                          ["class"])
        for cls in CLASSES:
            for state in STATES:
                jobs.add_metric([cls, state], f.count(cls, state))
            depth.add_metric([cls], f.depth[cls])
            since = f.oldest_ms[cls]
            oldest.add_metric([cls], max(0, f.at_ms - since) / 1000 if since is not None else 0)
            overdue.add_metric([cls], f.overdue[cls])
            service = f.estimate_s(cls)
            estimate.add_metric([cls], service if service is not None else NAN)
        running = _gauge("reckon_running_claims", "Jobs running under a worker's lease.")
        running.add_metric([], f.total("running"))
        unknown = _gauge("reckon_unknown_outcomes", "Jobs reconciling: outcome unknown, the provider is asked.")
        unknown.add_metric([], f.total("reconciling"))
        review = _gauge("reckon_needs_review", "Jobs waiting for an operator's decision.")
        review.add_metric([], f.total("needs_review"))
        dead = _gauge("reckon_dead_letter_jobs", "Failed (dead-lettered) jobs currently kept.")
        dead.add_metric([], f.total("failed"))
        yield from (jobs, depth, oldest, overdue, estimate, running, unknown, review, dead)
        yield _histogram(f, "ttc", "reckon_time_to_completion_seconds", "Admission to a terminal state.", TTC_BOUNDS)
        yield _histogram(f, "attempts", "reckon_attempts_per_job", "Attempts of each completed job.", ATTEMPT_BOUNDS)

    def _money_and_counters(self, f: Figures) -> Iterator[Metric]:
        exposure = _gauge("reckon_exposure_units", "Unsettled cost units, all tenants.", ["kind"])
        for kind in ("reserved", "uncertain"):
            exposure.add_metric([kind], f.number(f"ledger:{kind}"))
        settled = CounterMetricFamily("reckon_settled_units", "Cost units settled, all tenants.")
        settled.add_metric([], f.number("ledger:settled"))
        finished = CounterMetricFamily("reckon_jobs_finished", "Jobs that reached a terminal state.",
                                       labels=["class", "state", "error_class"])
        for labels, n in _prefixed(f, "finished:"):
            finished.add_metric(labels, n)
        retries = CounterMetricFamily("reckon_retries", "Retries scheduled, by error class.", labels=["error_class"])
        for labels, n in _prefixed(f, "retries:"):
            retries.add_metric(labels, n)
        refused = CounterMetricFamily("reckon_admission_refused", "Admissions refused, by reason.", labels=["reason"])
        for reason in REFUSALS:
            refused.add_metric([reason], f.number(f"refused:{reason}"))
        yield from (exposure, settled, finished, retries, refused)
        for name, field, text in (
            ("reckon_dead_letters", "dead_letters_total", "Jobs dead-lettered (moved to failed)."),
            ("reckon_leases_expired", "leases_expired_total", "Worker leases that expired (the job was reconciled)."),
            ("reckon_stale_writes_rejected", "stale_writes_rejected", "Writes refused for a stale lease generation."),
            ("reckon_charge_overruns", "charge_overruns_total",
             "Charges beyond what the job held (an invariant violation), booked in full."),
        ):
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], f.number(field))
            yield counter

    def _fleet(self, f: Figures) -> Iterator[Metric]:
        """Per server: stop marks, slots, watched prompts, whether a watcher holds it; pauses, parked jobs."""
        blocked = _gauge("reckon_provider_blocked", "1 while dispatch to a server is stopped, by reason.",
                         ["provider", "reason"])
        slots = _gauge("reckon_provider_slots", "Dispatch slots of a server: busy and cap.", ["provider", "kind"])
        watched = _gauge("reckon_provider_watched", "Prompts at a server, followed by its watcher.", ["provider"])
        up = _gauge("reckon_watcher_up", "1 while a watcher holds the server's lock.", ["provider"])
        for name, view in f.fleet.items():
            for reason in SERVER_BLOCKS:
                blocked.add_metric([name, reason], int(reason in view["stopped"]))
            slots.add_metric([name, "busy"], view["busy"])
            slots.add_metric([name, "cap"], view["cap"])
            watched.add_metric([name], view["watched"])
            up.add_metric([name], int(f.watchers[name]))
        paused = _gauge("reckon_class_paused", "1 while a workload class is paused.", ["class"])
        for cls in CLASSES:
            paused.add_metric([cls], int(cls in f.pauses))
        parked = _gauge("reckon_parked_jobs", "Queued jobs waiting for a free server slot.")
        parked.add_metric([], f.parked)
        sweeper = _gauge("reckon_sweeper_last_pass_age_seconds",
                         "Seconds since the sweeper's last pass (on Redis's clock); NaN if it never ran.")
        sweeper.add_metric([], (f.at_ms - f.sweeper_ms) / 1000 if f.sweeper_ms else NAN)
        sweepers = _gauge("reckon_sweepers_alive", "Sweepers that passed in the last 30 s (each one's own heartbeat).")
        sweepers.add_metric([], f.sweepers_alive())
        budget = _gauge("reckon_retry_budget_tokens", "Tokens left in the shared retry budget.", ["provider"])
        budget.add_metric([BUDGET_PROVIDER], f.budget if f.budget is not None else NAN)
        yield from (blocked, slots, watched, up, paused, parked, sweeper, sweepers, budget)


class Metrics:
    public = True

    def __init__(self, store: Store, caps: dict[str, int]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(StateCollector(store, caps))

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.registry)
