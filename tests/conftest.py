"""Shared fixtures: a real redis-server on a free loopback port, flushed for every test.

The port is chosen at import, before any test module imports pipeline.work.actors
(which reads RECKON_REDIS_URL once), so every process and thread agrees on it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from pipeline.providers import sim as simulated
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests import cluster


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


REDIS_PORT = free_port()
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
os.environ["RECKON_REDIS_URL"] = REDIS_URL
os.environ["RECKON_BROKER_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/1"


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02,
               what: Callable[[], object] | None = None) -> None:
    """Wait for ``predicate``; past ``timeout`` fail, with ``what()`` (what was found) when given."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time" + (f": {what()}" if what else ""))
        time.sleep(interval)


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): SIGTERM, then
    SIGKILL after 10 s, so its children (gunicorn's workers, chromium's renderers) go with it."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the process group ``proc`` leads and reap it: for a server a finished test no longer reads,
    whose graceful stop (gunicorn's, an event stream's end) would only cost time."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (make test installs it)")
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [exe, "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--notify-keyspace-events", "Kl"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=REDIS_PORT)
    try:
        wait_until(lambda: _pings(client))
        yield REDIS_URL
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``BOTH_BACKENDS = True`` runs each of its Redis tests twice: against one
    redis-server and against a three-primary Redis Cluster (state split into ``cluster.SHARDS`` shards)."""
    if getattr(metafunc.module, "BOTH_BACKENDS", False) and "redis_client" in metafunc.fixturenames:
        metafunc.parametrize("backend", ["single", "cluster"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "single")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    running = cluster.start(tmp_path_factory.mktemp("cluster"))
    yield running
    running.stop()


@pytest.fixture
def shards(backend: str) -> Iterator[int]:
    """The shard count of this test's deployment (set before any key is built; one shard again after,
    so a test that follows builds the keys it expects)."""
    count = cluster.SHARDS if backend == "cluster" else 1
    keys.use_shards(count)
    yield count
    keys.use_shards(1)


@pytest.fixture
def redis_client(request: pytest.FixtureRequest, backend: str, shards: int, redis_server: str) -> Iterator[Any]:
    if backend == "cluster":
        client = request.getfixturevalue("redis_cluster").client()
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client = connect_url(redis_server)
        client.flushall()
    yield client
    client.close()


@pytest.fixture
def store(redis_client: Any, shards: int) -> Store:
    return Store(redis_client, shards=shards)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return dataclasses.replace(Settings.from_env(), blob_dir=str(tmp_path / "blobs"), lease_seconds=5.0,
                               poll_interval_seconds=0.01, submit_settle_seconds=0.0, watch=False,
                               providers="sim=http://127.0.0.1:9;cap=1000")


@pytest.fixture
def tenant(redis_client: redis.Redis) -> Callable[..., str]:
    """Factory: create a tenant and return a fresh API key for it."""

    def make(name: str = "acme", allowance: int = 10_000) -> str:
        create_tenant(redis_client, name, allowance)
        return create_key(redis_client, name)

    return make


@pytest.fixture
def sim() -> Iterator[simulated.SimServer]:
    server = simulated.start(delay=0.0)
    yield server
    server.close()
