"""The ``reckon`` commands for webhooks: a tenant's endpoints (``reckon tenant webhook ...``) and the
deliveries whose retries ran out (``reckon webhook deliveries|redeliver``)."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.operate.commands import _print
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.tenants import TenantError, _require
from pipeline.webhooks.deliveries import Deliveries
from pipeline.webhooks.endpoints import EndpointNotFound, Endpoints, TooManyEndpoints, check, view


def add_parsers(tenant: Any, verbs: Any) -> None:
    """``tenant webhook`` under the tenant commands, ``webhook`` beside them."""
    hook = tenant.add_parser("webhook", help="a tenant's webhook endpoints").add_subparsers(dest="what", required=True)
    add = hook.add_parser("add", help="add an endpoint; prints its signing secret once")
    add.add_argument("name")
    add.add_argument("url")
    add.add_argument("--types", required=True, help="event types, comma separated (job.completed,job.failed,...)")
    add.set_defaults(run=webhook_add)
    listing = hook.add_parser("list", help="the tenant's endpoints (never their secrets)")
    listing.add_argument("name")
    listing.set_defaults(run=webhook_list)
    for verb, text, run in (("remove", "remove an endpoint and its exhausted deliveries", webhook_remove),
                            ("rotate", "a new signing secret, printed once; the old one signs on for "
                                       "RECKON_WEBHOOK_SECRET_OVERLAP_SECONDS", webhook_rotate)):
        sub = hook.add_parser(verb, help=text)
        sub.add_argument("name")
        sub.add_argument("endpoint")
        sub.set_defaults(run=run)
    webhook = verbs.add_parser("webhook").add_subparsers(dest="verb", required=True)
    shown = webhook.add_parser("deliveries", help="an endpoint's deliveries whose retries ran out, newest first")
    shown.add_argument("tenant")
    shown.add_argument("endpoint")
    shown.set_defaults(run=deliveries_list)
    again = webhook.add_parser("redeliver", help="send exhausted deliveries again, each with a new retry window")
    again.add_argument("tenant")
    again.add_argument("endpoint")
    again.add_argument("--message", action="append", metavar="WEBHOOK_ID", help="only these (default: all)")
    again.set_defaults(run=redeliver)


def _endpoint_or_fail(endpoints: Endpoints, tenant: str, endpoint: str) -> dict[str, Any]:
    try:
        return endpoints.get(tenant, endpoint)
    except EndpointNotFound:
        raise TenantError(f"tenant {tenant} has no webhook endpoint {endpoint}") from None


def webhook_add(store: Store, args: argparse.Namespace) -> int:
    _require(store.redis, args.name)
    settings = Settings.from_env()
    url, types = check(args.url, [t.strip() for t in args.types.split(",") if t.strip()],
                       allow_private=settings.webhook_allow_private)
    try:
        endpoint, secret = Endpoints(store).add(args.name, url, types)
    except TooManyEndpoints as exc:
        raise TenantError(str(exc)) from None
    _print({**view(endpoint), "secret": secret})
    return 0


def webhook_list(store: Store, args: argparse.Namespace) -> int:
    _print({"tenant": args.name, "webhooks": [view(e) for e in Endpoints(store).all(args.name)]})
    return 0


def webhook_remove(store: Store, args: argparse.Namespace) -> int:
    try:
        Endpoints(store).remove(args.name, args.endpoint)
    except EndpointNotFound:
        raise TenantError(f"tenant {args.name} has no webhook endpoint {args.endpoint}") from None
    _print({"tenant": args.name, "removed": args.endpoint})
    return 0


def webhook_rotate(store: Store, args: argparse.Namespace) -> int:
    endpoints = Endpoints(store)
    _endpoint_or_fail(endpoints, args.name, args.endpoint)
    endpoint, secret = endpoints.rotate(args.name, args.endpoint, Settings.from_env().webhook_secret_overlap_seconds)
    _print({**view(endpoint), "secret": secret})
    return 0


def deliveries_list(store: Store, args: argparse.Namespace) -> int:
    _endpoint_or_fail(Endpoints(store), args.tenant, args.endpoint)
    _print({"endpoint": args.endpoint, "exhausted": Deliveries(store).exhausted(args.tenant, args.endpoint)})
    return 0


def redeliver(store: Store, args: argparse.Namespace) -> int:
    _endpoint_or_fail(Endpoints(store), args.tenant, args.endpoint)
    count = Deliveries(store).redeliver(args.tenant, args.endpoint, args.message)
    print(f"{count} deliveries due again to {args.endpoint}")
    return 0
