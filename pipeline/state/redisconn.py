"""The Redis clients of reckon's state and broker: one server, Sentinel, or Cluster (state only).

- ``redis://host:port/db``: one server (development, tests).
- ``redis+sentinel://host:port,host:port/<master>/<db>`` (or ``RECKON_SENTINELS`` with
  ``RECKON_SENTINEL_MASTER``, which settings turn into that URL): redis-py's ``Sentinel``. Every new
  connection asks the Sentinels where the master is, and a connection that finds its server gone or
  demoted (``READONLY``) is dropped, so a failover needs no process restart.
- ``RECKON_REDIS_CLUSTER=host:port,...``: redis-py's ``RedisCluster`` for the state store.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable, TypeVar
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from pipeline.settings import Settings

#: No Redis call waits longer than this (s): a worker cut off from Redis must not resume a step
#: minutes later on a decision it made before (every script runs in milliseconds).
SOCKET_TIMEOUT_S = 10.0
#: How long a question to one Sentinel may take (s) before the next Sentinel is asked.
SENTINEL_TIMEOUT_S = 1.0
SENTINEL_SCHEME = "redis+sentinel"
log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class SentinelTarget:
    """Where a ``redis+sentinel://`` URL points: the Sentinels, the master's name, the database."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None


def parse_addresses(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` -> [(host, port), ...]; ValueError on an entry without a port."""
    found = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isascii() or not port.isdigit():
            raise ValueError(f"not host:port: {entry!r}")
        found.append((host, int(port)))
    if not found:
        raise ValueError("no host:port given")
    return found


def parse_sentinel_url(url: str) -> SentinelTarget:
    """``redis+sentinel://[:password@]host:port,host:port/<master>[/<db>]``."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    password = unquote(userinfo.partition(":")[2]) if userinfo else ""
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2:
        raise ValueError("a Sentinel URL names the master: redis+sentinel://host:port,.../<master>/<db>")
    db = int(path[1]) if len(path) == 2 else 0
    return SentinelTarget(tuple(parse_addresses(hosts)), path[0], db, password or None)


def is_sentinel(url: str) -> bool:
    return urlsplit(url).scheme == SENTINEL_SCHEME


#: The name each connection of this process gives itself (``CLIENT SETNAME``, shown by ``CLIENT LIST``):
#: its role (web, worker, sweeper, watcher), set once by ``name_connections``.
_client_name: str | None = None


def name_connections(role: str) -> None:
    """Name every connection this process opens from now on after its role (``CLIENT LIST`` then says
    which process holds which connection; ops/bench/deployed.py counts each process's commands)."""
    global _client_name
    _client_name = role


#: Every client ``client_for`` made in this process, and whether it is a broker's (bytes replies):
#: ``open_pools`` fills their pools.
_clients: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def client_for(url: str, *, decode: bool = True, **options: Any) -> Any:
    """A client for one logical database at ``url`` (one server or a Sentinel-managed master);
    ``decode``: text replies (reckon's state) or bytes (Dramatiq's broker)."""
    options = {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": SOCKET_TIMEOUT_S, **options}
    if _client_name:
        options.setdefault("client_name", _client_name if decode else f"broker-{_client_name}")
    client: Any
    if not is_sentinel(url):
        client = redis.Redis.from_url(url, decode_responses=decode, **options)
    else:
        target = parse_sentinel_url(url)
        sentinel = Sentinel(list(target.sentinels), socket_timeout=SENTINEL_TIMEOUT_S,
                            socket_connect_timeout=SENTINEL_TIMEOUT_S)
        client = sentinel.master_for(target.master, db=target.db, password=target.password,
                                     decode_responses=decode, **options)
    _clients[client] = not decode
    return client


def open_pools(threads: int, broker: int | None = None) -> None:
    """Open now, before the process serves, as many connections as ``threads`` (the threads that share
    them) in every client's pool this process made, ``broker`` (default: ``threads``) in a broker's;
    connections it already holds count. A load then
    opens no more: each connection costs Redis a client struct and buffers (16 KB of reply buffer at
    first), which a connection opened under load adds to what the jobs of that load are charged.
    (A Cluster client's connections are its nodes': left alone.)
    Redis not answering leaves a pool as it is: its connections open when they are first needed."""
    for client, is_broker in list(_clients.items()):
        pool, count = getattr(client, "connection_pool", None), broker if is_broker and broker else threads
        if pool is None:
            continue
        taken: list[Any] = []
        try:
            while len(taken) < count:
                taken.append(pool.get_connection())
        except redis.RedisError as exc:
            log.warning("could not open connections at start", extra={"error": type(exc).__name__})
        finally:
            for conn in taken:
                pool.release(conn)


class Cluster(RedisCluster):
    """redis-py's Cluster client, routing ``FCALL`` by its first key as it routes ``EVALSHA``.

    redis-py asks a node (``COMMAND GETKEYS``) where each FCALL's keys are: a round trip more per
    call, to a node that may be the one just gone. reckon's scripts keep all their keys in one slot
    (one hash tag), so the first key decides."""

    def determine_slot(self, *args: Any) -> Any:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO") and len(args) > 3 and int(args[2]) > 0:
            return self.keyslot(args[3])
        return super().determine_slot(*args)


def connect(settings: Settings) -> Any:
    """The state-store client: text replies, at most ``SOCKET_TIMEOUT_S`` per call.

    Typed Any: redis.Redis and RedisCluster share no base class that names the commands."""
    if settings.redis_cluster:
        nodes = [ClusterNode(host, port) for host, port in parse_addresses(settings.redis_cluster)]
        return Cluster(startup_nodes=nodes, decode_responses=True, socket_timeout=SOCKET_TIMEOUT_S,
                       socket_connect_timeout=SOCKET_TIMEOUT_S)
    return connect_url(settings.redis_url)


def connect_url(url: str) -> Any:
    """The state-store client for a URL alone (tools and tests that have no settings)."""
    return client_for(url, health_check_interval=30)


#: Connections an asynchronous client opens at most (a thousand streams woken at once share them).
ASYNC_CONNECTIONS = 32


def async_client(settings: Settings, *, socket_timeout: float = SOCKET_TIMEOUT_S,
                 connections: int = ASYNC_CONNECTIONS) -> Any:
    """The state store over ``redis.asyncio`` (the streams process, api/streams/): text replies, one server,
    Sentinel or Cluster as ``connect`` chooses, at most ``connections`` to one server; connections named as
    this process's (``name_connections``)."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode as AsyncNode
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    options: dict[str, Any] = {"decode_responses": True, "socket_timeout": socket_timeout,
                               "socket_connect_timeout": SOCKET_TIMEOUT_S}
    if settings.redis_cluster:
        nodes = [AsyncNode(host, port) for host, port in parse_addresses(settings.redis_cluster)]
        return AsyncCluster(startup_nodes=nodes, **options)
    if _client_name:
        options["client_name"] = _client_name
    if not is_sentinel(settings.redis_url):  # at most ``connections``, a call waiting for one (no error)
        pool = aioredis.BlockingConnectionPool.from_url(settings.redis_url, health_check_interval=30,
                                                        max_connections=connections, timeout=socket_timeout,
                                                        **options)
        return aioredis.Redis(connection_pool=pool)
    target = parse_sentinel_url(settings.redis_url)
    sentinel = AsyncSentinel(list(target.sentinels), socket_timeout=SENTINEL_TIMEOUT_S,
                             socket_connect_timeout=SENTINEL_TIMEOUT_S)
    return sentinel.master_for(target.master, db=target.db, password=target.password, **options)


def broker_client(settings: Settings) -> redis.Redis:
    """The broker's client: bytes replies, as Dramatiq expects; one server or Sentinel."""
    return client_for(settings.broker_url, decode=False)


#: Errors from a Cluster node that mean it is gone or no longer holds the slot asked about. (ASK and
#: TRYAGAIN mean its slot is moving: the map is right, the call fails and is tried again later.)
STALE_NODE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.MovedError,
              redis.exceptions.ClusterDownError, redis.exceptions.ReadOnlyError)


def on_node(client: Any, key: str, call: Callable[[Any], T]) -> T:
    """``call`` with a client of the one server that holds ``key``: the node's own client in a
    Cluster, the client itself otherwise. For what must run on one server and one connection (a
    durable write and its ``WAIT``; the clock of a shard's primary). It bypasses RedisCluster's own
    redirect handling, so a node gone or no longer owning the slot makes the cluster client learn
    the slots anew before the error is raised: the caller's next try goes to the new owner."""
    if not isinstance(client, RedisCluster):
        return call(client)
    try:
        return call(client.get_node_from_key(key).redis_connection)
    except STALE_NODE:
        client.nodes_manager.initialize()
        raise
