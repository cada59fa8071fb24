"""Bearer-key authentication: a key maps to exactly one tenant.

A key found valid is trusted for ``RECKON_AUTH_CACHE_SECONDS`` (1 s) in this process, so a client's
requests cost no Redis read for it; a revoked key or a disabled tenant is refused within that
time. A key found unknown is looked up again on the next request (a key just made works at once).
"""

from __future__ import annotations

import time
from typing import Callable

import falcon
import redis

from api.problems import Problem
from pipeline.settings import DEFAULT_AUTH_CACHE_SECONDS
from pipeline.state.tenants import hash_key, tenant_for_key

#: Keys trusted at once, at most (all are forgotten when it is reached: a burst of many keys is
#: looked up again, never kept past its time).
MAX_TRUSTED = 10_000


class Authenticate:
    """Falcon middleware: sets ``req.context.tenant``; resources with ``public = True`` skip it."""

    def __init__(self, client: redis.Redis, *, trust_seconds: float = DEFAULT_AUTH_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.trust_seconds, self.clock = client, trust_seconds, clock
        self.trusted: dict[str, tuple[str, float]] = {}  # sha256 of a key -> (tenant, trusted until)

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        tenant = self.tenant(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if not tenant:
            raise Problem(
                401, "unauthorized", "Authentication required", "send Authorization: Bearer <api key>",
                headers={"WWW-Authenticate": 'Bearer realm="reckon"'},
            )
        req.context.tenant = tenant

    def tenant(self, api_key: str) -> str | None:
        """The key's tenant: trusted from an earlier lookup for ``trust_seconds``, else looked up."""
        digest, now = hash_key(api_key), self.clock()
        known = self.trusted.get(digest)
        if known is not None and now < known[1]:
            return known[0]
        tenant = tenant_for_key(self.redis, api_key)
        if tenant is None or self.trust_seconds <= 0:
            self.trusted.pop(digest, None)
            return tenant
        if len(self.trusted) >= MAX_TRUSTED:
            self.trusted.clear()
        self.trusted[digest] = (tenant, now + self.trust_seconds)
        return tenant
