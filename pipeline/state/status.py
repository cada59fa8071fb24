"""The fleet-wide figures operators read (``reckon status``, ``/ui``, ``/metrics``), from Redis in O(1).

Every figure comes from the keys each shard's scripts keep in step (``ShardKeys.globals``) and
the shards' fleet hashes, in a fixed number of commands whatever the number of tenants and jobs:
``TIME``, then one pipelined round trip of nine commands per shard and one per server.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipeline.state import archive, keys
from pipeline.state.jobs import PRIORITIES, State
from pipeline.state.keys import BATCH_RANK, JobKeys, ProviderKeys, TenantKeys
from pipeline.state.progress import TERMINAL
from pipeline.state.reads import class_pauses, fleet_view, merge_fleet
from pipeline.state.store import Store

CLASSES = PRIORITIES
STATES = tuple(state.value for state in State)
#: A sweeper passes every second; one silent this long (ms) is counted as stopped (``ReckonSweeperDown`` waits as long).
SWEEPER_ALIVE_MS = 30_000
#: The provider whose shared retry budget is reported (the budget is per provider kind, not per server).
BUDGET_PROVIDER = "comfyui"


def class_range(cls: str) -> tuple[int, str]:
    """The score range of one class in a shard's queue and due sets (ZRANGEBYSCORE bounds)."""
    low = BATCH_RANK if cls == "batch" else 0
    return low, f"({low + BATCH_RANK}"


@dataclass(frozen=True)
class Figures:
    """One reading of the global state, on Redis's clock."""

    at_ms: int
    stats: dict[str, str]
    depth: dict[str, int]
    oldest_ms: dict[str, int | None]
    overdue: dict[str, int]
    sweeper_ms: int | None
    #: Each sweeper of the last hour (host/pid) -> its last pass (ms).
    sweepers: dict[str, int]
    budget: float | None
    fleet: dict[str, dict[str, Any]]
    pauses: dict[str, int]
    parked: int
    watchers: dict[str, bool]

    def sweepers_alive(self) -> int:
        """Sweepers whose last pass is at most ``SWEEPER_ALIVE_MS`` old."""
        return sum(self.at_ms - at <= SWEEPER_ALIVE_MS for at in self.sweepers.values())

    def count(self, cls: str, state: str) -> int:
        return int(self.stats.get(f"jobs:{cls}:{state}", 0))

    def total(self, state: str) -> int:
        return sum(self.count(cls, state) for cls in CLASSES)

    def number(self, field: str) -> int:
        return int(float(self.stats.get(field, 0)))

    def estimate_s(self, cls: str) -> float | None:
        raw = self.stats.get(f"service_ms:{cls}")
        return float(raw) / 1000 if raw is not None else None


def read(store: Store, caps: dict[str, int]) -> Figures:
    client = store.redis
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    pipe = client.pipeline(transaction=False)
    for shard in keys.shards():
        pipe.hgetall(shard.stats)
        for cls in CLASSES:
            low, high = class_range(cls)
            pipe.zcount(shard.queue, low, high)
            pipe.zrangebyscore(shard.queue, low, high, start=0, num=1, withscores=True)
            pipe.zcount(shard.due, low, f"({low + now}")
        pipe.zcard(shard.parked)
        pipe.hgetall(shard.fleet)
    pipe.hgetall(keys.SWEEPER)
    pipe.hget(ProviderKeys(BUDGET_PROVIDER).budget, "tokens")
    for name in caps:
        pipe.exists(keys.watcher_lock(name))
    replies = pipe.execute()
    width = 3 + 3 * len(CLASSES)
    per_shard = [replies[i:i + width] for i in range(0, width * keys.shard_count(), width)]
    sweeper, budget, *locks = replies[width * keys.shard_count():]
    depth, oldest, overdue = dict.fromkeys(CLASSES, 0), dict.fromkeys(CLASSES, None), dict.fromkeys(CLASSES, 0)
    for shard_replies in per_shard:
        for i, cls in enumerate(CLASSES):
            count, first, late = shard_replies[1 + 3 * i:4 + 3 * i]
            depth[cls] += int(count)
            overdue[cls] += int(late)
            if first:
                queued = int(first[0][1]) - class_range(cls)[0]
                oldest[cls] = min(queued, oldest[cls] or queued)
    fleet = merge_fleet([shard_replies[-1] for shard_replies in per_shard])
    return Figures(
        at_ms=now, stats=merge_stats([shard_replies[0] for shard_replies in per_shard]), depth=depth,
        oldest_ms=oldest, overdue=overdue, sweeper_ms=int(sweeper["at"]) if "at" in sweeper else None,
        sweepers={name[3:]: int(at) for name, at in sweeper.items() if name.startswith("at:")},
        budget=float(budget) if budget is not None else None, fleet=fleet_view(fleet, caps),
        pauses=class_pauses(fleet), parked=sum(int(shard_replies[-2]) for shard_replies in per_shard),
        watchers={name: bool(up) for name, up in zip(caps, locks, strict=True)},
    )


def merge_stats(hashes: list[dict[str, str]]) -> dict[str, str]:
    """Shards' figures as one: counts and sums added; a service-time estimate (``service_ms:``) is
    the mean of the shards that have one."""
    if len(hashes) == 1:
        return hashes[0]
    totals: dict[str, int | float] = {}
    estimates: dict[str, list[float]] = {}
    for raw in hashes:
        for field, value in raw.items():
            if field.startswith("service_ms:"):
                estimates.setdefault(field, []).append(float(value))
            else:  # ledger totals stay exact integers
                totals[field] = totals.get(field, 0) + (int(value) if value.lstrip("-").isdigit() else float(value))
    return ({field: str(total) for field, total in totals.items()}
            | {field: str(sum(values) / len(values)) for field, values in estimates.items()})


def snapshot(store: Store, caps: dict[str, int]) -> dict[str, Any]:
    """The figures of ``reckon status`` and ``/ui`` as one JSON-ready dict (ages in seconds)."""
    f = read(store, caps)
    classes = {}
    for cls in CLASSES:
        oldest = f.oldest_ms[cls]
        classes[cls] = {
            "depth": f.depth[cls], "oldest_age_s": max(0, f.at_ms - oldest) / 1000 if oldest is not None else 0.0,
            **{state: f.count(cls, state) for state in ("running", "retry_wait", "reconciling", "needs_review")},
            "dead": f.count(cls, "failed"), "overdue": f.overdue[cls], "paused": cls in f.pauses,
            "service_estimate_s": f.estimate_s(cls),
        }
    return {
        "at": f.at_ms,
        "classes": classes,
        "exposure": {kind: f.number(f"ledger:{kind}") for kind in ("reserved", "uncertain", "settled")},
        "sweeper_age_s": (f.at_ms - f.sweeper_ms) / 1000 if f.sweeper_ms else None,
        "sweepers_alive": f.sweepers_alive(),
        "providers": {name: {"busy": view["busy"], "cap": view["cap"], "stopped": sorted(view["stopped"]),
                             "watched": view["watched"], "watcher_up": f.watchers[name]}
                      for name, view in f.fleet.items()},
        "parked": f.parked,
        "retry_budget": f.budget,
    }


LEDGER_KINDS = ("reserved", "uncertain", "settled")


@dataclass
class Truth:
    """The global figures as the jobs and ledgers themselves give them (``walk``)."""

    counts: Counter[tuple[str, str]]
    money: Counter[str]
    #: Queued job id -> its score in its shard's queue; unfinished job id -> its score in its shard's due set.
    queue: dict[str, int]
    due: dict[str, int]


#: The record fields ``walk`` reads of each job.
WALKED = ("state", "priority", "updated_at", "deadline")


def walk(client: Any, tenants: list[str]) -> Truth:
    """Read every job of every tenant (O(jobs), pipelined per tenant): for audits and rebuilds, not scrapes."""
    truth = Truth(Counter(), Counter(), {}, {})
    for tenant in tenants:
        ledger = client.hgetall(TenantKeys(tenant).ledger)
        truth.money.update({kind: int(ledger.get(kind, 0)) for kind in LEDGER_KINDS})
        ids = client.zrange(TenantKeys(tenant).jobs, 0, -1)
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(JobKeys(job_id).record, archive.hmget_fields(WALKED))
        for job_id, reply in zip(ids, pipe.execute(), strict=True):
            state, cls, updated, deadline = archive.values(job_id, WALKED, reply)
            truth.counts[(cls, state)] += 1
            rank = class_range(cls)[0]
            if state == "queued":
                truth.queue[job_id] = rank + int(updated)
            if state not in TERMINAL:
                truth.due[job_id] = rank + int(deadline)
    return truth


def by_shard(tenants: list[str]) -> dict[keys.ShardKeys, list[str]]:
    """Every shard -> the given tenants that live in it."""
    grouped: dict[keys.ShardKeys, list[str]] = {shard: [] for shard in keys.shards()}
    for tenant in tenants:
        grouped[TenantKeys(tenant).shard].append(tenant)
    return grouped


def audit(client: Any, tenants: list[str]) -> list[str]:
    """What differs between each shard's figures and its jobs (empty: nothing): jobs per class and state,
    ledger totals, membership of the queue and due indexes. Read at rest (nothing moving)."""
    problems = []
    for shard, members in by_shard(tenants).items():
        truth = walk(client, members)
        stats = client.hgetall(shard.stats)
        figured = Counter({(f.split(":")[1], f.split(":")[2]): int(v) for f, v in stats.items()
                           if f.startswith("jobs:") and int(v)})
        found = [f"jobs {' '.join(pair)}: global {figured[pair]} != {truth.counts[pair]}"
                 for pair in sorted(set(figured) | set(truth.counts)) if figured[pair] != truth.counts[pair]]
        found += [f"ledger {kind}: global {stats.get(f'ledger:{kind}', '0')} != {truth.money[kind]}"
                  for kind in LEDGER_KINDS if int(stats.get(f"ledger:{kind}", 0)) != truth.money[kind]]
        indexes = (("queue", set(client.zrange(shard.queue, 0, -1)), set(truth.queue)),
                   ("due", set(client.zrange(shard.due, 0, -1)), set(truth.due)))
        found += [f"{name} index: {len(have ^ want)} jobs differ" for name, have, want in indexes if have != want]
        prefix = f"shard {shard.n}: " if keys.shard_count() > 1 else ""
        problems += [prefix + problem for problem in found]
    return problems


def rebuild(client: Any, tenants: list[str]) -> Truth:
    """Write each shard's gauges (jobs per class and state, ledger totals, the queue and due indexes) from
    the jobs: after an upgrade from a version without them, with dispatch paused and no admissions (a
    change between the walk and the write would be lost). Counters and histograms are left alone.
    Returns the figures over all shards."""
    total = Truth(Counter(), Counter(), {}, {})
    for shard, members in by_shard(tenants).items():
        truth = walk(client, members)
        stale = [field for field in client.hkeys(shard.stats) if field.startswith(("jobs:", "ledger:"))]
        pipe = client.pipeline(transaction=True)
        if stale:
            pipe.hdel(shard.stats, *stale)
        fields = {f"jobs:{cls}:{state}": n for (cls, state), n in truth.counts.items()}
        pipe.hset(shard.stats, mapping=fields | {f"ledger:{kind}": truth.money[kind] for kind in LEDGER_KINDS})
        pipe.delete(shard.queue, shard.due)
        for key, scores in ((shard.queue, truth.queue), (shard.due, truth.due)):
            if scores:
                pipe.zadd(key, scores)
        pipe.execute()
        total.counts.update(truth.counts)
        total.money.update(truth.money)
        total.queue |= truth.queue
        total.due |= truth.due
    return total
