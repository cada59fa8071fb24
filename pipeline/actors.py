"""Dramatiq actors. ``dramatiq pipeline.actors`` runs workers; a message carries only a job id."""

from __future__ import annotations

import logging

import dramatiq

from .blobs import BlobStore
from .broker import ROUTES, build_broker
from .errors import StaleLease
from .executor import Executor
from .providers.comfyui import ComfyUI
from .providers.http import HttpTransport
from .settings import Settings
from .store import Store, connect

log = logging.getLogger(__name__)
settings = Settings.from_env()
broker = build_broker(settings)
dramatiq.set_broker(broker)
#: An attempt may not outlive the longest deadline a job can have, plus a margin.
TIME_LIMIT_MS = 25 * 3600 * 1000


_executor: Executor | None = None


def use(executor: Executor | None) -> None:
    """Run actors with this executor (tests, embedding); None: build one from settings."""
    global _executor
    _executor = executor


def executor() -> Executor:
    global _executor
    if _executor is None:
        store = Store(connect(settings.redis_url))
        provider = ComfyUI(HttpTransport(settings.provider_url), price_per_output=settings.price_per_output)
        _executor = Executor(
            store, provider, BlobStore(settings.blob_dir),
            lease_seconds=settings.lease_seconds, poll_interval=settings.poll_interval_seconds,
        )
    return _executor


def run_job(job_id: str) -> None:
    try:
        executor().run(job_id)
    except StaleLease:
        log.warning("job %s: lease lost to a newer claim; this worker stopped writing", job_id)


def _declare(priority: str, order: int) -> dramatiq.Actor:
    queue_name, actor_name = ROUTES[priority]
    return dramatiq.actor(
        run_job, actor_name=actor_name, queue_name=queue_name, priority=order, max_retries=0,
        time_limit=TIME_LIMIT_MS,
    )


run_interactive = _declare("interactive", 0)
run_batch = _declare("batch", 10)
