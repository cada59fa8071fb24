from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.fleet import Server
from pipeline.providers.base import Provider
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.providers.sim.server import SimServer
from pipeline.settings import Settings
from pipeline.state.progress import record
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from pipeline.work.sweeper import Sweeper
from pipeline.work.watcher import Watcher


def single(provider: Provider, cap: int = 1000) -> Fleet:
    """A fleet of one server, ``sim``, answered by ``provider``."""
    return Fleet([Server("sim", "http://sim", cap)], lambda _: provider)


WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


@pytest.fixture
def broker(redis_server: str):
    from pipeline.work import actors

    return actors.broker


@pytest.fixture
def admit(store: Store, settings: Settings, broker, tenant) -> Callable[..., str]:
    """Factory: admit a job for tenant acme through the real admission path; returns its id."""
    tenant()
    admitter = Admitter(store, Publisher(broker), settings)

    def make(key: str = "intent-1", **body: Any) -> str:
        return admitter.submit("acme", key, {"kind": "image", "workflow": WORKFLOW, "outputs": 1, **body}).job_id

    return make


@pytest.fixture
def make_executor(store: Store, settings: Settings) -> Callable[..., Executor]:
    def make(sim: SimServer, **options: Any) -> Executor:
        provider = ComfyUI(HttpTransport(sim.url, timeout=5), price_per_output=sim.sim.price_per_output)
        return Executor(store, single(provider), BlobStore(settings.blob_dir), dataclasses.replace(settings, **options))

    return make


@pytest.fixture
def make_router(store: Store, settings: Settings) -> Callable[..., Router]:
    def make(**options: Any) -> Router:
        return Router(store, dataclasses.replace(settings, **options), "comfyui", rng=lambda: 1.0)

    return make


class InProcess:
    """An in-process worker (Dramatiq, 2 threads), a watcher and a sweeper over ``servers``
    (name -> anything with a ``url``), in watch mode."""

    def __init__(self, store, settings, broker, servers, cap: int = 2) -> None:
        self.settings = dataclasses.replace(settings, watch=True, watch_poll_seconds=0.1, sweep_interval_seconds=0.1)
        self.fleet = Fleet([Server(name, server.url, cap) for name, server in servers.items()],
                           lambda s: ComfyUI(HttpTransport(s.url, timeout=10), price_per_output=10))
        actors.use(Executor(store, self.fleet, BlobStore(settings.blob_dir), self.settings))
        self.watcher = Watcher(self.fleet, store, Publisher(broker), self.settings,
                               lambda *point: record(store.scripts, *point))
        self.sweeper = Sweeper(store, Publisher(broker), self.settings)
        self.sweeper.servers = self.fleet.caps()
        self.stop = threading.Event()
        self.watching = threading.Thread(target=self.watcher.run, args=(self.stop,))
        self.sweeping = threading.Thread(target=self.sweeper.run, args=(self.stop,))
        self.worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)

    def __enter__(self) -> InProcess:
        self.watching.start()
        self.sweeping.start()
        self.worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.stop.set()
        self.watching.join()
        self.sweeping.join()
        actors.use(None)
