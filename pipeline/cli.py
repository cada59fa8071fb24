"""``reckon``: the operator's command line (tenants, keys, jobs, status)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from .jobs import iso
from .settings import Settings
from .tenants import TenantError, create_key, create_tenant
from .store import Store, connect

#: Job record fields never printed: the workflow is the client's private input.
PRIVATE_FIELDS = frozenset({"workflow"})


def _print(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def tenant_create(store: Store, args: argparse.Namespace) -> int:
    create_tenant(store.redis, args.name, args.allowance)
    _print(store.ledger(args.name) | {"tenant": args.name})
    return 0


def key_create(store: Store, args: argparse.Namespace) -> int:
    print(create_key(store.redis, args.tenant))
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


def status(store: Store, args: argparse.Namespace) -> int:
    totals: dict[str, int] = {}
    tenants = {}
    for tenant in store.tenants():
        counts = store.state_counts(tenant)
        tenants[tenant] = {"jobs": counts, "ledger": store.ledger(tenant)}
        for state, n in counts.items():
            totals[state] = totals.get(state, 0) + n
    _print({"jobs": totals, "tenants": tenants})
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="reckon", description=__doc__)
    verbs = root.add_subparsers(dest="noun", required=True)
    tenant = verbs.add_parser("tenant").add_subparsers(dest="verb", required=True)
    create = tenant.add_parser("create", help="create a tenant with an allowance in cost units")
    create.add_argument("name")
    create.add_argument("--allowance", type=int, required=True)
    create.set_defaults(run=tenant_create)
    key = verbs.add_parser("key").add_subparsers(dest="verb", required=True)
    kcreate = key.add_parser("create", help="print a new API key for a tenant (shown once)")
    kcreate.add_argument("tenant")
    kcreate.set_defaults(run=key_create)
    job = verbs.add_parser("job").add_subparsers(dest="verb", required=True)
    show = job.add_parser("show", help="a job's record, outputs, attempts and events")
    show.add_argument("id")
    show.set_defaults(run=job_show)
    verbs.add_parser("status", help="jobs per state and ledgers per tenant").set_defaults(run=status)
    return root


def main(argv: list[str] | None = None, store: Store | None = None) -> int:
    args = parser().parse_args(argv)
    store = store or Store(connect(Settings.from_env().redis_url))
    try:
        return args.run(store, args)
    except TenantError as exc:
        print(f"reckon: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
