"""Dramatiq actors. ``dramatiq pipeline.work.actors`` runs workers; a message carries only a job id."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Callable

import dramatiq

from pipeline.blobs import open_blobs
from pipeline.errors import AttemptFailed, StaleLease
from pipeline.fleet import Server
from pipeline.logs import configure
from pipeline.providers.base import Provider
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.providers.null import NullProvider
from pipeline.settings import Settings
from pipeline.state.redisconn import name_connections, open_pools
from pipeline.state.store import open_store
from pipeline.work.broker import ROUTES, Publisher, build_broker
from pipeline.work.executor import Executor
from pipeline.work.routing import FailureRouter, Router, Unpark


def _configure_dramatiq_worker() -> None:
    """JSON for a Dramatiq worker process (``dramatiq pipeline.work.actors``), called when the actors load.

    Only under Dramatiq's CLI: the watcher, the API and tests import the actors too, and their
    logging is theirs to set.
    """
    if "dramatiq.cli" in sys.modules:
        configure("worker")
        name_connections("worker")


log = logging.getLogger(__name__)
_configure_dramatiq_worker()  # JSON lines, in place of the format Dramatiq's CLI set
settings = Settings.from_env()
broker = build_broker(settings)
dramatiq.set_broker(broker)
#: An attempt may not outlive the longest deadline a job can have, plus a margin.
TIME_LIMIT_MS = 25 * 3600 * 1000

_executor: Executor | None = None
_building = threading.Lock()
_router: Router | None = None


def use(executor: Executor | None, router: Router | None = None) -> None:
    """Run actors with these parts (tests, embedding); None: build them from settings."""
    global _executor, _router
    _executor, _router = executor, router


def adapter(server: Server) -> Provider:
    """The server's adapter: ComfyUI's HTTP API, or for a ``null://`` URL the provider that runs
    nothing (benchmarks: pipeline/providers/null.py)."""
    if server.url.startswith("null:"):
        return NullProvider(server.url, price_per_output=server.price_per_output)
    return ComfyUI(HttpTransport(server.url), price_per_output=server.price_per_output,
                   fetch_seconds=settings.output_fetch_seconds)


def executor() -> Executor:
    """This worker process's executor, built by the first message's thread (the others wait for it).
    Redis not answering fails that message at once (the job stays queued and is sent again)."""
    global _executor
    with _building:
        if _executor is None:
            _executor = Executor(open_store(settings, wait_s=0), Fleet(settings.servers(), adapter),
                                 open_blobs(settings), settings)
    return _executor


def router() -> Router:
    global _router
    if _router is None:
        _router = Router(executor().store, settings)
    return _router


class OpenConnections(dramatiq.Middleware):
    """A worker process builds its executor and opens a connection per worker thread to the state and
    the broker (and one per queue's consumer) once it has booted, before its first message (``open_pools``): a load then opens none,
    whose buffers Redis would charge to the jobs of that load. Redis not answering leaves the executor
    to the first message, as before."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        try:
            executor()
        except Exception as exc:  # Redis not answering, say: the first message builds it, as before
            log.warning("executor not built at boot", extra={"error": type(exc).__name__})
            return
        # the state's: each thread, and the lease keeper's renewal and refunds threads (leases.py); the
        # broker's: each thread acks, each queue's consumer fetches, the doorbell subscribes (waking.py)
        open_pools(worker.worker_threads + 2, worker.worker_threads + len(worker.consumers) + 1)


# Dramatiq runs after-message hooks in reverse order: Unpark, added first, runs after the routing
# has retried or dead-lettered the job, which gives its slot back.
broker.add_middleware(Unpark(executor, Publisher(broker)))
broker.add_middleware(FailureRouter(router))
broker.add_middleware(OpenConnections())


def run_job(job_id: str) -> None:
    executor().run(job_id)


def reconcile_job(job_id: str) -> None:
    executor().reconcile(job_id)


def collect_job(job_id: str) -> None:
    executor().collect(job_id)


def _declare(fn: Callable[[str], None], route: str, order: int) -> dramatiq.Actor[[str], None]:
    queue_name, actor_name = ROUTES[route]
    declare = dramatiq.actor(actor_name=actor_name, queue_name=queue_name, priority=order,
                             time_limit=TIME_LIMIT_MS, throws=(AttemptFailed, StaleLease))
    return declare(fn)


run_interactive = _declare(run_job, "interactive", 0)
run_batch = _declare(run_job, "batch", 10)
reconcile = _declare(reconcile_job, "reconcile", 0)
#: Collects first: each one frees a server slot.
collect = _declare(collect_job, "collect", -2)
#: Parked jobs published when a slot frees: served first, they waited longest.
run_unparked = _declare(run_job, "unparked", -1)
