"""A tenant's webhook endpoints: add, read, rotate the secret of, remove.

An endpoint is a URL, the event types it wants, and its signing secrets: the newest first, and a rotated
one until its overlap ends (``RECKON_WEBHOOK_SECRET_OVERLAP_SECONDS``). A secret is shown once, when it is
made; views never hold one. Each change is one script (lua/webhook-set.lua), which also keeps the types
the tenant's endpoints want, copied into each job admitted from then on: a job admitted before its
tenant's first endpoint makes no webhook events.
"""

from __future__ import annotations

import re
import secrets
import socket
from typing import Any

import orjson

from pipeline.errors import InvalidRequest, JobNotFound, ReckonError
from pipeline.state.keys import ShardKeys, TenantKeys
from pipeline.state.scripts import Code
from pipeline.state.store import Store
from pipeline.webhooks import guard, signing

EVENT_TYPES = ("job.completed", "job.failed", "job.cancelled", "job.needs_review", "job.progress")
#: Endpoints one tenant may have; one more is refused (409 too-many-webhooks).
MAX_ENDPOINTS = 16
MAX_URL_LENGTH = 2048
_PROBLEM = "invalid-webhook"
ID_RE = re.compile(r"wh_[0-9a-f]{16}")


class EndpointNotFound(JobNotFound):
    """No such endpoint of this tenant."""


class TooManyEndpoints(ReckonError):
    """The tenant has ``MAX_ENDPOINTS`` endpoints already."""


def check(url: Any, types: Any, *, allow_private: bool) -> tuple[str, list[str]]:
    """The URL and types of a new endpoint, or InvalidRequest (problem ``invalid-webhook``) naming the field.

    A host given as an address, or ``localhost``, is checked here already; a name is checked each time a
    delivery resolves it (pipeline/webhooks/guard.py)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise InvalidRequest("url", f"a URL of at most {MAX_URL_LENGTH} characters", problem=_PROBLEM)
    try:
        _, host, _ = guard.check_url(url)
    except guard.Refused as exc:
        raise InvalidRequest("url", str(exc), problem=_PROBLEM) from None
    if not allow_private and _private_literal(host):
        raise InvalidRequest("url", "a private, loopback or link-local address is not allowed", problem=_PROBLEM)
    if not isinstance(types, list) or not types or not all(isinstance(t, str) for t in types):
        raise InvalidRequest("types", f"a non-empty list of event types: {', '.join(EVENT_TYPES)}", problem=_PROBLEM)
    unknown = sorted(set(types) - set(EVENT_TYPES))
    if unknown:
        raise InvalidRequest("types", f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}",
                             problem=_PROBLEM)
    return url, sorted(set(types))


def _private_literal(host: str) -> bool:
    """Whether ``host`` is an address (in any form a resolver reads as one: ``127.1``, ``2130706433``,
    ``0x7f000001``) that is not allowed."""
    host = host.strip("[]").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return not guard.allowed(host, allow_private=False)
    except ValueError:
        pass
    try:
        return not guard.allowed(socket.inet_ntoa(socket.inet_aton(host)), allow_private=False)
    except OSError:
        return False  # a name, not an address


def view(endpoint: dict[str, Any]) -> dict[str, Any]:
    """What the API shows of an endpoint: never a secret."""
    rotated = [s["until"] for s in endpoint["secrets"][1:] if s.get("until")]
    return {"id": endpoint["id"], "url": endpoint["url"], "types": endpoint["types"],
            "created_at": endpoint["created_at"], "previous_secret_valid_until": max(rotated) if rotated else None}


def signing_secrets(endpoint: dict[str, Any], now_ms: int) -> list[str]:
    """The secrets that sign a message now: the newest, and each rotated one still in its overlap."""
    return [s["secret"] for s in endpoint["secrets"] if s.get("until") is None or s["until"] > now_ms]


class Endpoints:
    """One store's endpoints, by tenant."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, tenant: str, url: str, types: list[str]) -> tuple[dict[str, Any], str]:
        """A new endpoint and its secret (shown once)."""
        secret = signing.new_secret()
        endpoint = {"id": "wh_" + secrets.token_hex(8), "url": url, "types": types,
                    "created_at": self.store.server_ms(TenantKeys(tenant).shard), "secrets": [{"secret": secret}]}
        self._set(tenant, endpoint)
        return endpoint, secret

    def all(self, tenant: str) -> list[dict[str, Any]]:
        raw = self.store.redis.hgetall(TenantKeys(tenant).webhooks)
        return sorted((orjson.loads(value) for value in raw.values()), key=lambda e: (e["created_at"], e["id"]))

    def get(self, tenant: str, endpoint_id: str) -> dict[str, Any]:
        raw = self.store.redis.hget(TenantKeys(tenant).webhooks, endpoint_id) if ID_RE.fullmatch(endpoint_id) else None
        if raw is None:
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")
        return orjson.loads(raw)

    def rotate(self, tenant: str, endpoint_id: str, overlap_seconds: int) -> tuple[dict[str, Any], str]:
        """A new secret for the endpoint (shown once); the one it replaces still signs for ``overlap_seconds``.
        Written only over the endpoint as read: a rotation or removal meanwhile makes it read again."""
        t = TenantKeys(tenant)
        while True:
            raw = self.store.redis.hget(t.webhooks, endpoint_id) if ID_RE.fullmatch(endpoint_id) else None
            if raw is None:
                raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")
            endpoint, now = orjson.loads(raw), self.store.server_ms(t.shard)
            kept = [{**s, "until": s.get("until") or now + overlap_seconds * 1000} for s in endpoint["secrets"]]
            secret = signing.new_secret()
            endpoint["secrets"] = [{"secret": secret}] + [s for s in kept if s["until"] > now]
            if self._set(tenant, endpoint, read=raw):
                return endpoint, secret

    def remove(self, tenant: str, endpoint_id: str) -> None:
        if not ID_RE.fullmatch(endpoint_id):
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")
        t = TenantKeys(tenant)
        reply = self.store.scripts("webhook-set", self._keys(t, endpoint_id), [endpoint_id, "", MAX_ENDPOINTS, ""])
        if int(reply[0]) == Code.NOT_FOUND:
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id}")

    def _set(self, tenant: str, endpoint: dict[str, Any], read: str = "") -> bool:
        """Write the endpoint (over ``read``, its JSON as read, when given); False when it was not as read."""
        t = TenantKeys(tenant)
        reply = self.store.scripts("webhook-set", self._keys(t, endpoint["id"]),
                                   [endpoint["id"], orjson.dumps(endpoint), MAX_ENDPOINTS, read])
        if int(reply[0]) == Code.LIMITED:
            raise TooManyEndpoints(f"a tenant has at most {MAX_ENDPOINTS} webhook endpoints")
        return int(reply[0]) == Code.OK

    @staticmethod
    def _keys(t: TenantKeys, endpoint_id: str) -> list[str]:
        shard: ShardKeys = t.shard
        return [t.webhooks, t.limits, shard.webhook_exhausted(endpoint_id), shard.webhook_deliveries,
                shard.webhook_due(endpoint_id), shard.webhook_ready, shard.webhook_order]
