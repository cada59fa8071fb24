"""Bearer-key authentication for the streams process: the web process's (api/auth.py), awaited, and
kept up while a stream is open.

A key maps to one tenant (``reckon:apikey:<sha256>``), refused while its tenant is disabled; a key
found valid is trusted for ``trust_seconds`` in this process, as the web process does. An open stream
holds its key's ``Grant``, one per key however many streams share it. One task (``Grants``) looks up
every held key again each ``trust_seconds``, in one round trip (an MGET of the keys, one of their
tenants' disabled marks), and refreshes the trust of those still valid; a key found revoked, or of a disabled tenant, by that
task or by any request, has its grant refused at once: each of its streams sends a final ``end`` event
and closes, and sends nothing after (docs/api.md "Event streams").
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import redis
from falcon.asgi import Request, Response
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.exceptions import RedisClusterException

from api.auth import DISABLED, REVOKED, Trusted, bearer, unauthorized
from pipeline.settings import DEFAULT_AUTH_CACHE_SECONDS
from pipeline.state import keys
from pipeline.state.tenants import hash_key

log = logging.getLogger(__name__)

#: Open streams' keys are looked up again at least this often (s), also when ``trust_seconds`` is 0
#: (RECKON_AUTH_CACHE_SECONDS=0: every request looks its key up; an open stream cannot, every 0).
MIN_RECHECK_SECONDS = 0.1
#: Keys an MGET of the re-check reads at most (~0.35 ms of Redis CPU at 1,000: no one command holds Redis long).
MGET_KEYS = 1_000


class Grant:
    """What the open streams of one key in this process may read: ``tenant``'s events, until ``refused``
    says why not; ``wakes`` are their rooms' wakes, called when it is refused."""

    def __init__(self, digest: str, tenant: str) -> None:
        self.digest, self.tenant = digest, tenant
        self.refused: str | None = None
        self.wakes: list[Callable[[], None]] = []


class Grants:
    """The keys of this process's open streams and their trust (``trusted``, shared with every request)."""

    def __init__(self, client: Any, *, trust_seconds: float = DEFAULT_AUTH_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis, self.trusted = client, Trusted(trust_seconds, clock)
        self.every = max(trust_seconds, MIN_RECHECK_SECONDS)
        self.held: dict[str, Grant] = {}
        self._task: asyncio.Task[None] | None = None

    async def tenant(self, digest: str) -> str | None:
        """The tenant of the key with this sha256: trusted from an earlier lookup, else looked up (two
        commands); a key found refused refuses its grant, if a stream holds one."""
        if (known := self.trusted.get(digest)) is not None:
            return known
        tenant = await self.redis.get(keys.api_key(digest))
        if tenant is None:
            self.refuse(digest, REVOKED)
        elif await self.redis.exists(keys.tenant_disabled(tenant)):
            self.refuse(digest, DISABLED)
            tenant = None
        return self.trusted.keep(digest, tenant)

    def hold(self, digest: str, tenant: str, wake: Callable[[], None]) -> Grant:
        """The key's grant for one more stream (``wake`` wakes it); the re-checking task started if it was not."""
        grant = self.held.setdefault(digest, Grant(digest, tenant))
        grant.wakes.append(wake)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream keys")
        return grant

    def release(self, grant: Grant, wake: Callable[[], None]) -> None:
        grant.wakes.remove(wake)
        if not grant.wakes and self.held.get(grant.digest) is grant:
            del self.held[grant.digest]

    def refuse(self, digest: str, why: str) -> None:
        """Refuse the key's grant (if a stream holds it) and wake its streams, which end."""
        grant = self.held.pop(digest, None)
        if grant is None:
            return
        grant.refused = why
        for wake in grant.wakes:
            wake()

    async def _run(self) -> None:
        """Every ``every`` seconds while a stream is open, look up every held key; then stop until one opens."""
        try:
            while self.held:
                await asyncio.sleep(self.every)
                try:
                    await self.check()
                except (redis.RedisError, RedisClusterException) as exc:
                    log.warning("stream keys not checked: Redis unavailable (%s)", exc)
        finally:
            self._task = None

    async def check(self) -> None:
        """Each held key's tenant and each of their tenants' disabled mark: two MGETs in one round trip
        (one more per ``MGET_KEYS`` more keys; on a Cluster, one MGET a slot), however many streams."""
        grants = list(self.held.values())
        tenants = sorted({grant.tenant for grant in grants})
        names = [keys.api_key(grant.digest) for grant in grants]
        marks = [keys.tenant_disabled(tenant) for tenant in tenants]
        if not grants:
            return
        if isinstance(self.redis, AsyncCluster):  # keys of many slots
            found, marked = await self.redis.mget_nonatomic(names), await self.redis.mget_nonatomic(marks)
        else:
            batches = [names[at:at + MGET_KEYS] for at in range(0, len(names), MGET_KEYS)]
            pipe = self.redis.pipeline(transaction=False)
            for batch in [*batches, *(marks[at:at + MGET_KEYS] for at in range(0, len(marks), MGET_KEYS))]:
                pipe.mget(batch)
            replies = await pipe.execute()
            found = [value for reply in replies[:len(batches)] for value in reply]
            marked = [value for reply in replies[len(batches):] for value in reply]
        disabled = {tenant for tenant, mark in zip(tenants, marked) if mark is not None}
        for grant, tenant in zip(grants, found):
            why = REVOKED if tenant != grant.tenant else DISABLED if tenant in disabled else None
            if why is not None:
                self.refuse(grant.digest, why)
            self.trusted.keep(grant.digest, None if why else tenant)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


class Authenticate:
    """Falcon ASGI middleware: sets ``req.context.tenant`` and ``req.context.key_hash`` (the key's sha256),
    or answers 401 problem+json; resources with ``public = True`` skip it."""

    def __init__(self, grants: Grants) -> None:
        self.grants = grants

    async def process_resource(self, req: Request, resp: Response, resource: object, params: dict) -> None:
        if resource is None or getattr(resource, "public", False):
            return
        api_key = bearer(req)
        digest = hash_key(api_key) if api_key else ""
        tenant = await self.grants.tenant(digest) if api_key else None
        if not tenant:
            raise unauthorized()
        req.context.tenant, req.context.key_hash = tenant, digest
