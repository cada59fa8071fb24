"""Bearer-key authentication for the streams process: the web process's (api/auth.py), awaited.

A key maps to one tenant (``reckon:apikey:<sha256>``), refused while its tenant is disabled; a key
found valid is trusted for ``trust_seconds`` in this process, as the web process does.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from falcon.asgi import Request, Response

from api.auth import MAX_TRUSTED
from api.problems import Problem
from pipeline.settings import DEFAULT_AUTH_CACHE_SECONDS
from pipeline.state import keys
from pipeline.state.tenants import hash_key


class Authenticate:
    """Falcon ASGI middleware: sets ``req.context.tenant``, or answers 401 problem+json; resources with
    ``public = True`` skip it."""

    def __init__(self, client: Any, *, trust_seconds: float = DEFAULT_AUTH_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.trust_seconds, self.clock = client, trust_seconds, clock
        self.trusted: dict[str, tuple[str, float]] = {}  # sha256 of a key -> (tenant, trusted until)

    async def process_resource(self, req: Request, resp: Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        tenant = await self.tenant(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if not tenant:
            raise Problem(
                401, "unauthorized", "Authentication required", "send Authorization: Bearer <api key>",
                headers={"WWW-Authenticate": 'Bearer realm="reckon"'},
            )
        req.context.tenant = tenant

    async def tenant(self, api_key: str) -> str | None:
        """The key's tenant: trusted from an earlier lookup for ``trust_seconds``, else looked up."""
        digest, now = hash_key(api_key), self.clock()
        known = self.trusted.get(digest)
        if known is not None and now < known[1]:
            return known[0]
        tenant = await self.redis.get(keys.api_key(digest))
        if tenant is not None and await self.redis.exists(keys.tenant_disabled(tenant)):
            tenant = None
        if tenant is None or self.trust_seconds <= 0:
            self.trusted.pop(digest, None)
            return tenant
        if len(self.trusted) >= MAX_TRUSTED:
            self.trusted.clear()
        self.trusted[digest] = (tenant, now + self.trust_seconds)
        return tenant
