"""Bearer-key authentication for the streams process: the web process's (api/auth.py), awaited.

A key maps to one tenant (``reckon:apikey:<sha256>``), refused while its tenant is disabled; a key
found valid is trusted for ``trust_seconds`` in this process, as the web process does.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from falcon.asgi import Request, Response

from api.auth import Trusted, bearer, unauthorized
from pipeline.settings import DEFAULT_AUTH_CACHE_SECONDS
from pipeline.state import keys
from pipeline.state.tenants import hash_key


class Authenticate:
    """Falcon ASGI middleware: sets ``req.context.tenant``, or answers 401 problem+json; resources with
    ``public = True`` skip it."""

    def __init__(self, client: Any, *, trust_seconds: float = DEFAULT_AUTH_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.trusted = client, Trusted(trust_seconds, clock)

    async def process_resource(self, req: Request, resp: Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        api_key = bearer(req)
        tenant = await self.tenant(api_key) if api_key else None
        if not tenant:
            raise unauthorized()
        req.context.tenant = tenant

    async def tenant(self, api_key: str) -> str | None:
        """The key's tenant: trusted from an earlier lookup for ``trust_seconds``, else looked up."""
        digest = hash_key(api_key)
        if (known := self.trusted.get(digest)) is not None:
            return known
        tenant = await self.redis.get(keys.api_key(digest))
        if tenant is not None and await self.redis.exists(keys.tenant_disabled(tenant)):
            tenant = None
        return self.trusted.keep(digest, tenant)
