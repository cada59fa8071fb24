from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pipeline.blobs import BlobStore
from pipeline.broker import Publisher
from pipeline.executor import Executor
from pipeline.fleet import Fleet, Server
from pipeline.jobs import Admitter
from pipeline.providers.base import Provider
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from pipeline.providers.sim import SimServer
from pipeline.routing import Router
from pipeline.settings import Settings
from pipeline.store import Store


def single(provider: Provider, cap: int = 1000) -> Fleet:
    """A fleet of one server, ``sim``, answered by ``provider``."""
    return Fleet([Server("sim", "http://sim", cap)], lambda _: provider)


WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


@pytest.fixture
def broker(redis_server: str):
    from pipeline import actors

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
