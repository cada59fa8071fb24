"""The routing middleware inside a real Dramatiq worker consuming from the real Redis broker."""

from __future__ import annotations

import time

import dramatiq
import redis

from pipeline import actors
from pipeline.broker import Publisher
from pipeline.providers import sim as simulated
from pipeline.routing import Router, backoff
from pipeline.sweeper import Sweeper
from tests.conftest import wait_until

DEAD_LETTERS = "dramatiq:reckon-interactive.XQ"


def run_worker(broker, until) -> None:
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        wait_until(until, timeout=15)
    finally:
        worker.stop()
        actors.use(None)


def test_backoff_is_capped_full_jitter_and_honours_retry_after() -> None:
    assert backoff(1, base=1.0, cap=60.0, retry_after=None, rng=lambda: 1.0) == 1.0
    assert backoff(4, base=1.0, cap=60.0, retry_after=None, rng=lambda: 1.0) == 8.0
    assert backoff(20, base=1.0, cap=60.0, retry_after=None, rng=lambda: 1.0) == 60.0
    assert backoff(4, base=1.0, cap=60.0, retry_after=None, rng=lambda: 0.25) == 2.0
    assert backoff(4, base=1.0, cap=60.0, retry_after=30.0, rng=lambda: 0.5) == 30.0


def test_a_transient_failure_becomes_a_scheduled_retry(store, admit, make_executor, make_router, broker) -> None:
    dead = simulated.start()
    dead.close()
    job_id = admit()
    actors.use(make_executor(dead), make_router(retry_base_seconds=30.0))
    run_worker(broker, lambda: store.job(job_id)["state"] == "retry_wait")
    assert store.job(job_id)["error_class"] == "transient"
    assert broker.client.zcard(DEAD_LETTERS) == 0  # scheduled in reckon's retry index, not failed


def test_a_terminal_failure_dead_letters_the_message_too(store, admit, make_executor, make_router, broker,
                                                         sim) -> None:
    sim.sim.faults = [{"kind": "policy"}]
    job_id = admit()
    actors.use(make_executor(sim), make_router())
    run_worker(broker, lambda: broker.client.zcard(DEAD_LETTERS) == 1)
    assert (store.job(job_id)["state"], store.job(job_id)["error_class"]) == ("failed", "policy_rejected")


class BrokenRouter(Router):
    def route(self, *args, **kwargs) -> str:
        raise redis.ConnectionError("state database went away mid-routing")


def test_a_failure_inside_routing_fails_the_message_and_the_job_is_recovered(
        store, settings, admit, make_executor, broker) -> None:
    dead = simulated.start()
    dead.close()
    job_id = admit()
    actors.use(make_executor(dead), BrokenRouter(store, settings, "comfyui"))
    run_worker(broker, lambda: broker.client.zcard(DEAD_LETTERS) == 1)  # failed, not acked and forgotten
    assert store.job(job_id)["state"] == "running"  # still leased: recovery will find it
    sweeper = Sweeper(store, Publisher(broker), settings, clock=lambda: time.time() + 60)
    assert sweeper.sweep_once()["leases_expired"] == 1
    assert store.job(job_id)["state"] == "reconciling"
