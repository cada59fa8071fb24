"""Bearer-key authentication: a key maps to exactly one tenant."""

from __future__ import annotations

import falcon
import redis

from pipeline.tenants import tenant_for_key

from .problems import Problem


class Authenticate:
    """Falcon middleware: sets ``req.context.tenant``; resources with ``public = True`` skip it."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        tenant = tenant_for_key(self.redis, token.strip()) if scheme.lower() == "bearer" and token else None
        if not tenant:
            raise Problem(
                401, "unauthorized", "Authentication required", "send Authorization: Bearer <api key>",
                headers={"WWW-Authenticate": 'Bearer realm="reckon"'},
            )
        req.context.tenant = tenant
