"""The ``reckon`` commands: each takes the store and its parsed arguments and returns an exit code."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from pipeline.blobs import open_blobs
from pipeline.operate.report import render, render_fairness
from pipeline.settings import Settings
from pipeline.state import admission, batches, fairness, keys
from pipeline.state.jobs import iso
from pipeline.state.keys import ProviderKeys, TenantKeys
from pipeline.state.migrate import migrate
from pipeline.state.progress import events_after
from pipeline.state.status import audit, rebuild, snapshot
from pipeline.state.admission import FleetLimits
from pipeline.state.store import Store
from pipeline.state.tenants import (
    create_key,
    create_tenant,
    is_disabled,
    list_keys,
    revoke_key,
    set_disabled,
    set_limits,
)
from pipeline.work.executor import BUDGET

#: Job record fields never printed: the workflow is the client's private input.
PRIVATE_FIELDS = frozenset({"workflow"})


def _print(value: Any) -> None:
    """Indented JSON; integer keys (a job's outputs, by index) become strings."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")


def tenant_create(store: Store, args: argparse.Namespace) -> int:
    create_tenant(store.redis, args.name, args.allowance)
    _print(store.ledger(args.name) | {"tenant": args.name})
    return 0


def tenant_disable(store: Store, args: argparse.Namespace) -> int:
    set_disabled(store.redis, args.name, args.verb == "disable")
    _print({"tenant": args.name, "disabled": is_disabled(store.redis, args.name)})
    return 0


def tenant_set(store: Store, args: argparse.Namespace) -> int:
    limits = set_limits(store.redis, args.name, max_inflight=args.max_inflight, rate=args.rate, burst=args.burst,
                        weight=args.weight, input_quota=args.input_quota)
    _print({"tenant": args.name, "limits": limits})
    return 0


def _rate(value: str) -> float:
    """``5``, ``5/s`` or ``0.5/s``: jobs per second."""
    return float(value.removesuffix("/s"))


def key_create(store: Store, args: argparse.Namespace) -> int:
    print(create_key(store.redis, args.tenant))
    return 0


def key_list(store: Store, args: argparse.Namespace) -> int:
    _print({"tenant": args.tenant, "key_hashes": list_keys(store.redis, args.tenant)})
    return 0


def key_revoke(store: Store, args: argparse.Namespace) -> int:
    tenant = revoke_key(store.redis, args.key)
    _print({"tenant": tenant, "revoked": True})
    return 0


def job_show(store: Store, args: argparse.Namespace) -> int:
    try:
        record = store.job(args.id)
    except ValueError:
        record = None
    if not record:
        print(f"no job {args.id}", file=sys.stderr)
        return 1
    shown = {k: v for k, v in record.items() if k not in PRIVATE_FIELDS}
    _print({"job": shown, "outputs": store.outputs(args.id), "attempts": store.attempts(args.id),
            "events": [e | {"at": iso(e["at"])} for e in store.events(args.id)]})
    return 0


def batch_show(store: Store, args: argparse.Namespace) -> int:
    """A tenant's batch: its jobs per state, and each item's job id and state or its problem's type."""
    items = batches.items(store.redis, args.tenant, args.id)
    if items is None:
        print(f"no batch {args.id} of tenant {args.tenant}", file=sys.stderr)
        return 1
    tally, records = batches.counts(store.redis, items)
    _print({"batch": args.id, "size": len(items), "counts": tally, "items": [
        {"index": i, "job": item, "state": records.get(item, {}).get("state")} if isinstance(item, str)
        else {"index": i, "problem": item.get("type")} for i, item in enumerate(items)]})
    return 0


#: The index each state's jobs sit in (scored by time).
STATE_INDEX = {"queued": "queued", "running": "leases", "retry_wait": "retry", "reconciling": "reconcile",
               "needs_review": "review", "failed": "dead", "completed": "done", "cancelled": "done"}


def job_events(store: Store, args: argparse.Namespace) -> int:
    """A job's state changes and progress points, in seq order (never the workflow)."""
    if not _exists(store, args.id):
        print(f"no job {args.id}", file=sys.stderr)
        return 1
    _print([e | {"at": iso(e["at"])} for e in events_after(store.redis, args.id, args.after)])
    return 0


def jobs_list(store: Store, args: argparse.Namespace) -> int:
    """Jobs in one state, across tenants or for one: id, tenant, priority, updated, error."""
    tenants = [args.tenant] if args.tenant else store.tenants()
    records = [record for tenant in tenants for record in _newest_in_state(store, tenant, args.state, args.limit)]
    records.sort(key=lambda record: int(record.get("updated_at", 0)))  # the newest N of all tenants, oldest first
    _print([{"id": record["id"], "tenant": record["tenant"], "priority": record.get("priority"),
             "updated_at": iso(int(record.get("updated_at", 0))),
             "error": {"class": record.get("error_class") or None, "reason": record.get("error_reason") or None}}
            for record in records[-args.limit:]])
    return 0


def _newest_in_state(store: Store, tenant: str, state: str, limit: int) -> list[dict[str, str]]:
    """Up to ``limit`` of the tenant's newest jobs in ``state``, read from the state's index newest
    first, page by page: `done` holds completed and cancelled jobs, so a page may hold none."""
    index, start = getattr(TenantKeys(tenant), STATE_INDEX[state]), 0
    found: list[dict[str, str]] = []
    while len(found) < limit:
        ids = store.redis.zrevrange(index, start, start + limit - 1)
        if not ids:
            break
        found += [record for record, _ in store.jobs_with_outputs(ids) if record.get("state") == state]
        start += limit
    return found[:limit]


def tenant_show(store: Store, args: argparse.Namespace) -> int:
    """One tenant: ledger, jobs per state, admission limits, whether it is disabled."""
    if args.name not in store.tenants():
        print(f"no tenant {args.name}", file=sys.stderr)
        return 1
    limits = store.redis.hgetall(TenantKeys(args.name).limits)
    jobs = {state: n for state, n in store.state_counts(args.name).items() if n}
    _print({"tenant": args.name, "ledger": store.ledger(args.name), "jobs": jobs,
            "limits": {k: v for k, v in limits.items() if k in ("max_inflight", "rate", "burst", "input_quota")},
            "disabled": is_disabled(store.redis, args.name)})
    return 0


def _exists(store: Store, job_id: str) -> bool:
    try:
        return store.job(job_id) is not None
    except ValueError:  # not a job id
        return False


def status(store: Store, args: argparse.Namespace) -> int:
    """The fleet on one screen (O(1) reads, whatever the number of tenants), then the tenants with the
    most queued cost (reads up to fairness.MAX_QUEUED_READ queued jobs per shard); ``--watch S``
    redraws it every S seconds until interrupted; ``--json`` for scripts. Per tenant: ``reckon tenant show``."""
    caps = _caps()
    while True:
        snap, fair = snapshot(store, caps), fairness.view(store, fresh=not args.watch)
        if args.json:
            _print({**snap, "fairness": fair})
        else:
            screen = render(snap) + "\n" + render_fairness(fair) + "\n"
            sys.stdout.write(("\x1b[H\x1b[2J" if args.watch else "") + screen)
        sys.stdout.flush()
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def admission_show(store: Store, args: argparse.Namespace) -> int:
    _print(admission.current(store.redis, _limits()))
    return 0


def admission_set(store: Store, args: argparse.Namespace) -> int:
    admission.change(store.redis, args.cls, queue_cap=args.queue_cap, target_s=args.target_wait, reset=args.reset)
    _print(admission.current(store.redis, _limits()))
    return 0


def stats_audit(store: Store, args: argparse.Namespace) -> int:
    problems = audit(store.redis, store.tenants())
    _print({"problems": problems})
    return 1 if problems else 0


def stats_rebuild(store: Store, args: argparse.Namespace) -> int:
    truth = rebuild(store.redis, store.tenants())
    _print({"jobs": sum(truth.counts.values()), "queued": len(truth.queue), "unfinished": len(truth.due),
            "problems": audit(store.redis, store.tenants())})
    return 0


def _limits() -> FleetLimits:
    return FleetLimits.of(Settings.from_env())


def pause(store: Store, args: argparse.Namespace) -> int:
    """``reckon pause --class C`` / ``--provider P``: no new claims or submissions for it, admission goes on."""
    done = store.pause_class(args.cls) if args.cls else store.block_provider(args.provider, "dispatch_paused")
    _print({"paused": {"class": args.cls} if args.cls else {"provider": args.provider}, "changed": done})
    return 0


def resume(store: Store, args: argparse.Namespace) -> int:
    """Lift a pause; the next unpark (a worker's next message, or the sweeper's pass within a second)
    dispatches what waited, interactive first, oldest first."""
    done = store.resume_class(args.cls) if args.cls else store.clear_provider(args.provider, ["dispatch_paused"])
    _print({"resumed": {"class": args.cls} if args.cls else {"provider": args.provider}, "changed": done})
    return 0


def _caps() -> dict[str, int]:
    return Settings.from_env().caps()


def _listing(store: Store, index: str, when: str) -> list[dict[str, Any]]:
    """Every job in one of the tenants' indexes; ``when`` names what the index's score is."""
    rows = []
    for tenant in store.tenants():
        for job_id, score in store.redis.zrange(getattr(TenantKeys(tenant), index), 0, -1, withscores=True):
            record = store.job(job_id) or {}
            rows.append({"id": job_id, "state": record.get("state"), when: iso(int(score)),
                         "error": {"class": record.get("error_class"), "reason": record.get("error_reason")},
                         "uncertain": int(record.get("uncertain", 0))})
    return rows


def dlq_list(store: Store, args: argparse.Namespace) -> int:
    _print(_listing(store, "dead", "failed_at"))
    return 0


def dlq_replay(store: Store, args: argparse.Namespace) -> int:
    store.replay(args.id)
    _print({"id": args.id, "state": (store.job(args.id) or {}).get("state")})
    return 0


def review_list(store: Store, args: argparse.Namespace) -> int:
    _print(_listing(store, "review", "review_expires_at"))
    return 0


def review_resolve(store: Store, args: argparse.Namespace) -> int:
    state = store.resolve_review(args.id, args.decision, reason=f"operator_{args.decision}")
    _print({"id": args.id, "state": state})
    return 0


def provider_clear(store: Store, args: argparse.Namespace) -> int:
    cleared = store.clear_provider(args.name)
    _print({"provider": args.name, "cleared": cleared})
    return 0


def provider_forget(store: Store, args: argparse.Namespace) -> int:
    freed = store.slots.forget(args.name)
    _print({"provider": args.name, "freed": freed})
    return 0


def provider_pause(store: Store, args: argparse.Namespace) -> int:
    store.block_provider(args.name, "dispatch_paused")
    _print({"provider": args.name, "blocked": store.provider_block(args.name)})
    return 0


def provider_status(store: Store, args: argparse.Namespace) -> int:
    """Every configured server: slots in use of its cap, why dispatch to it is stopped, prompts
    watched there; the jobs parked for a free slot; the fleet's retry budget."""
    _print({"servers": store.fleet(_caps()), "parked": sum(store.redis.zcard(shard.parked) for shard in keys.shards()),
            "retry_budget": store.redis.hgetall(ProviderKeys(BUDGET).budget)})
    return 0


def blobs_gc(store: Store, args: argparse.Namespace) -> int:
    keep = store.referenced_blobs()
    removed, kept = open_blobs(Settings.from_env()).collect(keep, min_age_s=args.min_age)
    _print({"removed": removed, "kept": kept, "referenced": len(keep)})
    return 0


def keys_migrate(store: Store, args: argparse.Namespace) -> int:
    moved = migrate(store.redis, dry_run=args.dry_run, resume=args.resume)
    _print({"shards": keys.shard_count(), "dry_run": args.dry_run, **moved})
    return 0
