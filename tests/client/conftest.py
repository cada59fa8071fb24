"""The client against the real stack (tests/faults/conftest.py ``Stack``) or the API alone under
gunicorn (tests/api/conftest.py ``Web``), through loopback proxies that each test stops."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.state.tenants import create_key, create_tenant
from tests.api.conftest import Web
from tests.client.proxy import Proxy
from tests.faults.conftest import Stack

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


def whole_stack(stack: Stack, redis_client: Any, delay: float) -> str:
    """The tenant "acme" and its API key, with a provider taking ``delay`` a prompt, the API, a worker
    (and its watcher) and a sweeper running."""
    create_tenant(redis_client, "acme", 1_000)
    api_key = create_key(redis_client, "acme")
    stack.start_provider(delay=delay)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    return api_key


def job_body(**overrides: Any) -> dict[str, Any]:
    return {"kind": "image", "workflow": WORKFLOW, "outputs": 1, **overrides}


@pytest.fixture
def stack_with(redis_client, tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Factory: a stack whose processes get these RECKON_* settings; its processes are stopped after the test."""
    made: list[Stack] = []

    def make(**env: str) -> Stack:
        made.append(Stack(tmp_path, **env))
        return made[-1]

    try:
        yield make
    finally:
        for running in made:
            running.stop(graceful=False)


@pytest.fixture
def stack(stack_with: Callable[..., Stack]) -> Stack:
    return stack_with()


@pytest.fixture
def web(redis_client, tmp_path: Path) -> Iterator[Web]:
    server = Web(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop(graceful=False)


@pytest.fixture
def proxy() -> Iterator[Callable[..., Proxy]]:
    """Factory: a proxy in front of a port (``Proxy``'s options); every one is stopped after the test."""
    started: list[Proxy] = []

    def make(upstream: int, **faults: Any) -> Proxy:
        started.append(Proxy(upstream, **faults))
        return started[-1]

    yield make
    for running in started:
        running.stop()
