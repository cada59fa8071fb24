"""The routing middleware inside a real Dramatiq worker consuming from the real Redis broker."""

from __future__ import annotations

import dataclasses
import threading
import time

import dramatiq
import redis

from pipeline.state.scripts import Scripts
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.routing import Router, backoff
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until
from tests.pipeline.test_failures import FAILS_BEFORE_SENDING, inject

DEAD_LETTERS = "dramatiq:reckon-interactive.XQ"
BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}


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


def test_a_transient_failure_becomes_a_scheduled_retry(store, admit, make_executor, make_router, broker,
                                                       sim) -> None:
    inject(sim, FAILS_BEFORE_SENDING)
    job_id = admit()
    actors.use(make_executor(sim), make_router(retry_base_seconds=30.0))
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
        store, settings, admit, make_executor, broker, sim) -> None:
    inject(sim, FAILS_BEFORE_SENDING)
    job_id = admit()
    actors.use(make_executor(sim), BrokenRouter(store, settings, "comfyui"))
    run_worker(broker, lambda: broker.client.zcard(DEAD_LETTERS) == 1)  # failed, not acked and forgotten
    assert store.job(job_id)["state"] == "running"  # still leased: recovery will find it
    sweeper = Sweeper(store, Publisher(broker), settings, clock=lambda: time.time() + 60)
    assert sweeper.sweep_once()["leases_expired"] == 1
    assert store.job(job_id)["state"] == "reconciling"


class FlakyClaims(Store):
    """The state database drops the connection on the first claim, then recovers."""

    failures = 1

    def claim(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise redis.ConnectionError("connection reset before the claim")
        return super().claim(*args, **kwargs)


def test_an_error_before_the_claim_loses_no_job(store, settings, tenant, make_executor, make_router, broker,
                                                sim) -> None:
    tenant()
    grace = 0.5
    settings = dataclasses.replace(settings, outbox_grace_seconds=grace, sweep_interval_seconds=0.1)
    job_id = Admitter(store, Publisher(broker), settings).submit("acme", "k", BODY).job_id
    executor = make_executor(sim)
    executor.store = FlakyClaims(store.redis)
    actors.use(executor, make_router())
    sweeper = Sweeper(store, Publisher(broker), settings)
    stop = threading.Event()
    sweeping = threading.Thread(target=sweeper.run, args=(stop,))
    sweeping.start()
    started = time.monotonic()
    try:
        run_worker(broker, lambda: store.job(job_id)["state"] == "completed")
    finally:
        stop.set()
        sweeping.join()
    assert time.monotonic() - started < grace + 3  # the window, one sweep, and the run itself
    assert broker.client.zcard(DEAD_LETTERS) == 1  # the first message failed; the job did not
    assert [a["state"] for a in store.attempts(job_id)] == ["completed"]
    assert [c["units"] for c in sim.sim.charges] == [10]


class Unreplicated(Store):
    """A primary none of whose writes reaches a replica in time (every durable write times out),
    except the submit mark, which does: the prompt goes out and its outputs are unconfirmed."""

    def mark_submit(self, *args, **kwargs):
        return Store(self.redis).mark_submit(*args, **kwargs)


def test_an_unconfirmed_submit_mark_sends_nothing_and_gives_the_attempt_back(
        store, admit, make_executor, make_router, broker, sim) -> None:
    job_id = admit()
    executor = make_executor(sim)
    executor.store = Store(store.redis, Scripts(store.redis, replicas=1, ack_timeout_ms=20))  # no replica here
    actors.use(executor, make_router())
    run_worker(broker, lambda: store.job(job_id)["state"] == "retry_wait")
    job = store.job(job_id)
    assert (job["error_class"], job["attempts_allowed"]) == ("replication_timeout", "4")  # not the job's fault
    assert sim.sim.history == {} and broker.client.zcard(DEAD_LETTERS) == 0  # nothing sent, nothing dead-lettered


def test_an_unconfirmed_write_after_the_submission_drops_the_message_and_reconciliation_settles_it(
        store, settings, admit, make_executor, make_router, broker, sim) -> None:
    job_id = admit()
    executor = make_executor(sim)
    executor.store = Unreplicated(store.redis, Scripts(store.redis, replicas=1, ack_timeout_ms=20))
    actors.use(executor, make_router())
    run_worker(broker, lambda: len(sim.sim.history) == 1 and store.job(job_id)["state"] == "running")
    assert broker.client.zcard(DEAD_LETTERS) == 0  # dropped with a warning: the job is not lost
    sweeper = Sweeper(store, Publisher(broker), settings, clock=lambda: time.time() + 60)
    assert sweeper.sweep_once()["leases_expired"] == 1
    assert store.job(job_id)["state"] == "reconciling"
    assert make_executor(sim).reconcile(job_id) is True  # an ordinary store: replicas confirm again
    assert store.job(job_id)["state"] == "completed" and len(sim.sim.history) == 1  # run and paid once
