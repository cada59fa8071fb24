"""``reckon``: the operator's command line (tenants, keys, webhooks, jobs, status, dead letters, reviews,
providers, money after the fact, saved workflows)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pipeline.errors import (
    BlobUnreadable,
    IncompleteOutputs,
    InsufficientAllowance,
    InvalidRequest,
    NotAllowed,
    WrongShards,
)
from pipeline.fleet import DEFAULT_SERVER
from pipeline.operate import hooks, money, workflows
from pipeline.operate.commands import (
    _rate,
    admission_set,
    admission_show,
    batch_show,
    blobs_gc,
    dlq_list,
    dlq_replay,
    job_events,
    job_show,
    jobs_list,
    key_create,
    key_list,
    key_revoke,
    keys_migrate,
    pause,
    provider_clear,
    provider_forget,
    provider_pause,
    provider_status,
    resume,
    review_list,
    review_resolve,
    stats_audit,
    stats_rebuild,
    status,
    tenant_create,
    tenant_disable,
    tenant_set,
    tenant_show,
)
from pipeline.settings import Settings
from pipeline.state.jobs import State
from pipeline.state.migrate import MigrationRefused
from pipeline.state.store import Store, open_store
from pipeline.state.tenants import TenantError


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="reckon", description=__doc__)
    verbs = root.add_subparsers(dest="noun", required=True)
    tenant = verbs.add_parser("tenant").add_subparsers(dest="verb", required=True)
    _tenant_commands(tenant)
    hooks.add_parsers(tenant, verbs)
    money.add_parsers(verbs)
    workflows.add_parsers(verbs)
    _key_commands(verbs.add_parser("key").add_subparsers(dest="verb", required=True))
    job = verbs.add_parser("job").add_subparsers(dest="verb", required=True)
    show = job.add_parser("show", help="a job's record, outputs, attempts and events")
    show.add_argument("id")
    show.set_defaults(run=job_show)
    batch = verbs.add_parser("batch").add_subparsers(dest="verb", required=True).add_parser(
        "show", help="a tenant's batch: its jobs per state, each item's job and state or its problem's type")
    batch.add_argument("tenant")
    batch.add_argument("id")
    batch.set_defaults(run=batch_show)
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
    forget = provider.add_parser("forget", help="a server removed for good: give back the slots reviews kept there")
    forget.add_argument("name", metavar="SERVER")
    forget.set_defaults(run=provider_forget)
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


def _tenant_commands(tenant: Any) -> None:
    create = tenant.add_parser("create", help="create a tenant with an allowance in cost units")
    create.add_argument("name")
    create.add_argument("--allowance", type=int, required=True)
    create.set_defaults(run=tenant_create)
    show_tenant = tenant.add_parser("show", help="a tenant's ledger, jobs per state, limits")
    show_tenant.add_argument("name")
    show_tenant.set_defaults(run=tenant_show)
    limits = tenant.add_parser("set", help="admission limits: jobs in flight, submission rate (429 above them); "
                                                "weight in fair dispatch")
    limits.add_argument("name")
    limits.add_argument("--max-inflight", type=int, help="queued + running + retry_wait + reconciling (0: none)")
    limits.add_argument("--rate", type=_rate, help="submissions per second, e.g. 5/s (0: none)")
    limits.add_argument("--burst", type=int, help="submissions at once above the rate (default: the rate)")
    limits.add_argument("--weight", type=float,
                        help="share of the fleet in fair dispatch, by cost: 0.001 to 1000 (default 1)")
    limits.add_argument("--input-quota", type=int, metavar="BYTES",
                        help="bytes the tenant's uploaded inputs may hold (507 above; 0: RECKON_INPUT_QUOTA_BYTES)")
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


def main(argv: list[str] | None = None, store: Store | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        # checked: an operator's shell without RECKON_SHARDS must not write shard 0 alone
        store = store or open_store(settings, wait_s=0)
        return args.run(store, args)
    except (TenantError, NotAllowed, InsufficientAllowance, IncompleteOutputs, WrongShards,
            MigrationRefused, BlobUnreadable, InvalidRequest) as exc:
        print(f"reckon: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
