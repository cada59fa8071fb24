"""Bearer-key authentication: a key maps to exactly one tenant.

A key found valid is trusted for ``RECKON_AUTH_CACHE_SECONDS`` (1 s) in this process, so a client's
requests cost no Redis read for it; a revoked key or a disabled tenant is refused within that
time. A key found unknown is looked up again on the next request (a key just made works at once).
An open event stream asks again (``Authenticate.refusal``) before it sends what it read, and ends once
its key is refused (docs/api.md "Authentication and errors").
"""

from __future__ import annotations

import time
from typing import Any, Callable

import falcon
import redis

from api.problems import Problem
from pipeline.settings import DEFAULT_AUTH_CACHE_SECONDS
from pipeline.state.tenants import hash_key, is_disabled, tenant_for_hash

#: Keys trusted at once, at most (all are forgotten when it is reached: a burst of many keys is
#: looked up again, never kept past its time).
MAX_TRUSTED = 10_000
#: Why an open stream's key is refused: the ``detail`` of the stream's final ``end`` event.
REVOKED = "the API key of this stream was revoked"
DISABLED = "the tenant of this stream is disabled"


class Trusted:
    """The keys found valid in this process, each trusted for ``seconds`` (none when 0)."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds, self.clock = seconds, clock
        self._until: dict[str, tuple[str, float]] = {}  # sha256 of a key -> (tenant, trusted until)

    def get(self, digest: str) -> str | None:
        known = self._until.get(digest)
        return known[0] if known is not None and self.clock() < known[1] else None

    def keep(self, digest: str, tenant: str | None) -> str | None:
        """Remember the lookup's answer (forget the key when it found none) and return it."""
        if tenant is None or self.seconds <= 0:
            self._until.pop(digest, None)
            return tenant
        if len(self._until) >= MAX_TRUSTED:
            self._until.clear()
        self._until[digest] = (tenant, self.clock() + self.seconds)
        return tenant


def bearer(req: Any) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or None."""
    scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def unauthorized() -> Problem:
    return Problem(401, "unauthorized", "Authentication required", "send Authorization: Bearer <api key>",
                   headers={"WWW-Authenticate": 'Bearer realm="reckon"'})


class Authenticate:
    """Falcon middleware: sets ``req.context.tenant``; resources with ``public = True`` skip it."""

    def __init__(self, client: redis.Redis, *, trust_seconds: float = DEFAULT_AUTH_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.trusted = client, Trusted(trust_seconds, clock)

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        api_key = bearer(req)
        digest = hash_key(api_key) if api_key else ""
        tenant = self.tenant(digest) if api_key else None
        if not tenant:
            raise unauthorized()
        req.context.tenant, req.context.key_hash = tenant, digest

    def tenant(self, digest: str) -> str | None:
        """The tenant of the key with this sha256: trusted from an earlier lookup for ``trust_seconds``,
        else looked up."""
        return self.trusted.get(digest) or self.trusted.keep(digest, tenant_for_hash(self.redis, digest))

    def refusal(self, digest: str, tenant: str) -> str | None:
        """None while the key with this sha256 still authenticates ``tenant`` (trusted, else looked up),
        else why not (``REVOKED``, ``DISABLED``): what an open event stream asks before it sends."""
        if self.tenant(digest) == tenant:
            return None
        return DISABLED if is_disabled(self.redis, tenant) else REVOKED
