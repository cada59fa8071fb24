"""The streams process's Falcon ASGI app factory: routes, middleware and error handlers, nothing else.

gunicorn serves ``api.streams.app:create_app()`` with uvicorn workers (ops/streams.conf.py).
"""

from __future__ import annotations

import logging
from typing import Any

import falcon
import falcon.asgi
import redis
from redis.exceptions import RedisClusterException

from api.app import open_admitter
from api.problems import Problem, serialize
from api.streams.auth import Authenticate, Grants
from api.streams.hub import DEFAULT_BLOCK_MS, Hub
from api.streams.resources import JobStream, Slots, TenantStream
from api.streams.waits import Holds, Job, Jobs
from pipeline.errors import WrongShards
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.redisconn import async_client, name_connections
from pipeline.state.store import open_store

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, block_ms: int = DEFAULT_BLOCK_MS) -> falcon.asgi.App:
    settings = settings or Settings.from_env()
    keys.use_shards(settings.shards)
    name_connections("streams")
    client = async_client(settings)
    # the readers' XREADs block for block_ms, each on a connection of its own: one a shard
    reader = async_client(settings, socket_timeout=block_ms / 1000 + 10, connections=settings.shards + 1)
    hub = Hub(client, reader, block_ms=block_ms)
    slots = Slots(settings.streams_max_streams)
    grants = Grants(client, trust_seconds=settings.auth_cache_seconds)

    app = falcon.asgi.App(middleware=[Authenticate(grants), _Lifespan(hub, grants, settings.shards, client, reader)])
    app.set_error_serializer(serialize)
    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(redis.RedisError, _unavailable)
    app.add_error_handler(RedisClusterException, _unavailable)
    app.add_route("/v1/jobs/{job_id}/events/stream", JobStream(hub, slots, settings.streams_ping_seconds, grants))
    app.add_route("/v1/events/stream", TenantStream(hub, slots, settings.streams_ping_seconds, grants))
    add_job_routes(app, settings, hub, slots)
    app.add_route("/healthz", _Health())
    return app


def add_job_routes(app: falcon.asgi.App, settings: Settings, hub: Hub, slots: Slots) -> None:
    """``POST /v1/jobs`` and ``GET /v1/jobs/{job_id}``, held for ``Prefer: wait`` (api/streams/waits.py);
    admission through the web process's ``Admitter`` on a synchronous store and broker of this process."""
    store = open_store(settings, check=False)  # checked when the worker starts (check_shards)
    holds = Holds(hub, slots, store)
    app.add_route("/v1/jobs", Jobs(open_admitter(settings, store), holds))
    app.add_route("/v1/jobs/{job_id}", Job(holds))


class _Lifespan:
    """Starts a reader per shard when the worker starts; stops them and the key checks, and closes the
    clients, when it stops."""

    def __init__(self, hub: Hub, grants: Grants, shards: int, *clients: Any) -> None:
        self.hub, self.grants, self.shards, self.clients = hub, grants, shards, clients

    async def process_startup(self, scope: dict, event: dict) -> None:
        await check_shards(self.hub.redis)
        for shard in range(self.shards):
            self.hub.start(shard)

    async def process_shutdown(self, scope: dict, event: dict) -> None:
        await self.hub.close()
        await self.grants.close()
        for client in self.clients:
            await client.aclose()


async def check_shards(client: Any) -> None:
    """Refuse to start (WrongShards) with another shard count than the deployment recorded
    (``Store.check_shards``): every stream would read the wrong shards and find nothing. Redis not
    answering yet is no reason to stop (nothing recorded: the first web process or worker records it)."""
    try:
        recorded = await client.hget(keys.ShardKeys(0).meta, "shards")
    except (redis.RedisError, RedisClusterException) as exc:
        log.warning("shard count not checked: Redis unavailable (%s)", exc)
        return
    if recorded is not None and int(recorded) != keys.shard_count():
        raise WrongShards(f"RECKON_SHARDS is {keys.shard_count()} but this Redis holds {recorded} shards")


class _Health:
    public = True

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


async def _unavailable(req: Any, resp: Any, exc: Exception, params: dict) -> None:
    log.warning("answered 503: Redis unavailable (%s: %s)", type(exc).__name__, exc)
    raise Problem(503, "state-unavailable", "Service unavailable", "job state cannot be read now; retry",
                  headers={"Retry-After": "1"})


async def _unexpected(req: Any, resp: Any, exc: Exception, params: dict) -> None:
    log.error("unhandled %s answered 500", type(exc).__name__, exc_info=exc)
    raise Problem(500, "internal-error", "Internal error", "the request could not be completed; retry later")
