"""``reckon``: the operator's command line (tenants, keys, jobs, status, dead letters, reviews, providers)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from pipeline import admission, keys
from pipeline.blobs import open_blobs
from pipeline.errors import BlobUnreadable, IncompleteOutputs, InsufficientAllowance, NotAllowed, WrongShards
from pipeline.executor import BUDGET
from pipeline.fleet import DEFAULT_SERVER
from pipeline.jobs import State, iso
from pipeline.keys import ProviderKeys, TenantKeys
from pipeline.migrate import MigrationRefused, migrate
from pipeline.progress import events_after
from pipeline.report import render
from pipeline.settings import Settings
from pipeline.status import audit, rebuild, snapshot
from pipeline.store import FleetLimits, Store, open_store
from pipeline.tenants import (
    TenantError,
    create_key,
    create_tenant,
    is_disabled,
    list_keys,
    revoke_key,
    set_disabled,
    set_limits,
)

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
    limits = set_limits(store.redis, args.name, max_inflight=args.max_inflight, rate=args.rate, burst=args.burst)
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
            "limits": {k: v for k, v in limits.items() if k in ("max_inflight", "rate", "burst")},
            "disabled": is_disabled(store.redis, args.name)})
    return 0


def _exists(store: Store, job_id: str) -> bool:
    try:
        return store.job(job_id) is not None
    except ValueError:  # not a job id
        return False


def status(store: Store, args: argparse.Namespace) -> int:
    """The fleet on one screen (O(1) reads, whatever the number of tenants); ``--watch S`` redraws it
    every S seconds until interrupted; ``--json`` for scripts. Per tenant: ``reckon tenant show``."""
    caps = _caps()
    while True:
        snap = snapshot(store, caps)
        if args.json:
            _print(snap)
        else:
            sys.stdout.write(("\x1b[H\x1b[2J" if args.watch else "") + render(snap) + "\n")
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


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="reckon", description=__doc__)
    verbs = root.add_subparsers(dest="noun", required=True)
    _tenant_commands(verbs.add_parser("tenant").add_subparsers(dest="verb", required=True))
    _key_commands(verbs.add_parser("key").add_subparsers(dest="verb", required=True))
    job = verbs.add_parser("job").add_subparsers(dest="verb", required=True)
    show = job.add_parser("show", help="a job's record, outputs, attempts and events")
    show.add_argument("id")
    show.set_defaults(run=job_show)
    events = job.add_parser("events", help="a job's state changes and progress, in order")
    events.add_argument("id")
    events.add_argument("--after", type=int, default=0, help="only events with a larger seq")
    events.set_defaults(run=job_events)
    jobs = verbs.add_parser("jobs", help="jobs in one state (every tenant, or --tenant)")
    jobs.add_argument("--state", required=True, choices=[s.value for s in State])
    jobs.add_argument("--tenant")
    jobs.add_argument("--limit", type=int, default=100, help="the newest N (default 100)")
    jobs.set_defaults(run=jobs_list)
    status_ = verbs.add_parser("status", help="per class: depth, oldest age, running, ...; money; sweeper; servers")
    status_.add_argument("--watch", type=float, metavar="SECONDS", help="redraw every SECONDS until Ctrl-C")
    status_.add_argument("--json", action="store_true", help="one JSON object (with --watch: one per redraw)")
    status_.set_defaults(run=status)
    _admission_commands(verbs.add_parser("admission").add_subparsers(dest="verb", required=True))
    stats = verbs.add_parser("stats").add_subparsers(dest="verb", required=True)
    stats.add_parser("audit", help="compare the global figures with every job (O(jobs); exit 1 on a difference)"
                     ).set_defaults(run=stats_audit)
    stats.add_parser("rebuild", help="rewrite the global gauges from every job (after an upgrade; pause "
                                     "dispatch and stop admissions first)").set_defaults(run=stats_rebuild)
    for verb, run, text in (("pause", pause, "stop claims and submissions of a class or a server; admission goes on"),
                            ("resume", resume, "lift a pause: what waited is dispatched, best first")):
        sub = verbs.add_parser(verb, help=text)
        which = sub.add_mutually_exclusive_group(required=True)
        which.add_argument("--class", dest="cls", choices=("interactive", "batch"))
        which.add_argument("--provider", metavar="SERVER")
        sub.set_defaults(run=run)
    dlq = verbs.add_parser("dlq").add_subparsers(dest="verb", required=True)
    dlq.add_parser("list", help="failed (dead-lettered) jobs").set_defaults(run=dlq_list)
    replay = dlq.add_parser("replay", help="run a failed job again (reserves its ceiling again)")
    replay.add_argument("id")
    replay.set_defaults(run=dlq_replay)
    review = verbs.add_parser("review").add_subparsers(dest="verb", required=True)
    review.add_parser("list", help="jobs whose outcome needs an operator").set_defaults(run=review_list)
    resolve = review.add_parser("resolve", help="decide a needs_review job")
    resolve.add_argument("id")
    decision = resolve.add_mutually_exclusive_group(required=True)
    for name in ("completed", "failed", "retry"):
        decision.add_argument(f"--{name}", dest="decision", action="store_const", const=name)
    resolve.set_defaults(run=review_resolve)
    provider = verbs.add_parser("provider").add_subparsers(dest="verb", required=True)
    provider.add_parser("status", help="each server's load, cap and stops; parked jobs; retry budget"
                        ).set_defaults(run=provider_status)
    for verb, run, text in (("pause", provider_pause, "drain a server: no new prompts, those there finish"),
                            ("clear", provider_clear, "clear a pause, credential or unreachable mark")):
        sub = provider.add_parser(verb, help=text)
        sub.add_argument("name", nargs="?", default=DEFAULT_SERVER, metavar="SERVER")
        sub.set_defaults(run=run)
    migrate_ = verbs.add_parser("keys").add_subparsers(dest="verb", required=True).add_parser(
        "migrate", help="bring a Redis written by an older reckon to this layout (every reckon process stopped)")
    migrate_.add_argument("--dry-run", action="store_true", help="count what would move, change nothing")
    migrate_.add_argument("--resume", action="store_true", help="finish a migration that was interrupted")
    migrate_.set_defaults(run=keys_migrate)
    blobs = verbs.add_parser("blobs").add_subparsers(dest="verb", required=True)
    gc = blobs.add_parser("gc", help="delete stored outputs no job on record holds (after retention purged them)")
    gc.add_argument("--min-age", type=float, default=3600.0, help="seconds; younger blobs are kept (default 3600)")
    gc.set_defaults(run=blobs_gc)
    return root


def blobs_gc(store: Store, args: argparse.Namespace) -> int:
    keep = store.referenced_blobs()
    removed, kept = open_blobs(Settings.from_env()).collect(keep, min_age_s=args.min_age)
    _print({"removed": removed, "kept": kept, "referenced": len(keep)})
    return 0


def _tenant_commands(tenant: Any) -> None:
    create = tenant.add_parser("create", help="create a tenant with an allowance in cost units")
    create.add_argument("name")
    create.add_argument("--allowance", type=int, required=True)
    create.set_defaults(run=tenant_create)
    show_tenant = tenant.add_parser("show", help="a tenant's ledger, jobs per state, limits")
    show_tenant.add_argument("name")
    show_tenant.set_defaults(run=tenant_show)
    limits = tenant.add_parser("set", help="admission limits: jobs in flight, submission rate (429 above them)")
    limits.add_argument("name")
    limits.add_argument("--max-inflight", type=int, help="queued + running + retry_wait + reconciling (0: none)")
    limits.add_argument("--rate", type=_rate, help="submissions per second, e.g. 5/s (0: none)")
    limits.add_argument("--burst", type=int, help="submissions at once above the rate (default: the rate)")
    limits.set_defaults(run=tenant_set)
    for verb, text in (("disable", "refuse every key of the tenant (401 on every route); jobs already "
                                   "admitted run on"),
                       ("enable", "accept the tenant's keys again")):
        sub = tenant.add_parser(verb, help=text)
        sub.add_argument("name")
        sub.set_defaults(run=tenant_disable)


def _admission_commands(admission_: Any) -> None:
    admission_.add_parser("show", help="queue cap per class and the interactive target wait, and who set them"
                          ).set_defaults(run=admission_show)
    change = admission_.add_parser("set", help="change a class's queue cap (503 above it) or the interactive "
                                               "target wait (batch is shed past it)")
    change.add_argument("--class", dest="cls", required=True, choices=("interactive", "batch"))
    change.add_argument("--queue-cap", type=int, help="queued jobs of the class admitted at most")
    change.add_argument("--target-wait", type=int, metavar="SECONDS", help="interactive only")
    change.add_argument("--reset", action="store_true", help="back to the environment's defaults")
    change.set_defaults(run=admission_set)


def _key_commands(key: Any) -> None:
    create = key.add_parser("create", help="print a new API key for a tenant (shown once)")
    create.add_argument("tenant")
    create.set_defaults(run=key_create)
    listing = key.add_parser("list", help="the sha256 of each of a tenant's keys")
    listing.add_argument("tenant")
    listing.set_defaults(run=key_list)
    revoke = key.add_parser("revoke", help="revoke a key, given as the key or its sha256 (401 from then on)")
    revoke.add_argument("key", metavar="KEY_OR_HASH")
    revoke.set_defaults(run=key_revoke)


def keys_migrate(store: Store, args: argparse.Namespace) -> int:
    moved = migrate(store.redis, dry_run=args.dry_run, resume=args.resume)
    _print({"shards": keys.shard_count(), "dry_run": args.dry_run, **moved})
    return 0


def main(argv: list[str] | None = None, store: Store | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        # checked: an operator's shell without RECKON_SHARDS must not write shard 0 alone
        store = store or open_store(settings, wait_s=0)
        return args.run(store, args)
    except (TenantError, NotAllowed, InsufficientAllowance, IncompleteOutputs, WrongShards,
            MigrationRefused, BlobUnreadable) as exc:
        print(f"reckon: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
