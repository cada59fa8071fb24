"""Regression tests for the holes a review found (issue 6 §1), in process: a real redis-server,
the simulated ComfyUI over loopback HTTP, the executor, the router and the sweeper.

Each reproduces the scenario that broke a promise and checks exact charges (the simulated
provider's ledger), exact ledger figures and exact states.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed, StaleLease
from pipeline.operate import cli
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from pipeline.state import keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.executor import Executor
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until
from tests.pipeline.conftest import WORKFLOW, single
from tests.pipeline.test_failures import attempt, balanced, inject, lost_in_a_restart, reconcile, units

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True

RECONCILE_QUEUE = "dramatiq:reckon-reconcile"


def sweeper(store, settings, *, ahead: float = 0.0) -> Sweeper:
    return Sweeper(store, Publisher(actors.broker), settings, clock=lambda: time.time() + ahead)


@pytest.mark.parametrize("path", ["/history", "/view"])
def test_a_failed_read_after_submission_is_reconciled_never_resubmitted(store, admit, make_executor, make_router,
                                                                        sim, path) -> None:
    job_id = admit(outputs=2)
    inject(sim, {"kind": "read_error", "path": path, "status": 503})
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "reconcile"
    assert store.job(job_id)["state"] == "reconciling"
    assert [(a["state"], a["error_class"]) for a in store.attempts(job_id)] == [("unknown", "unknown_outcome")]
    assert reconcile(executor, router, job_id) == "reconciled"
    assert store.job(job_id)["state"] == "completed"
    assert units(sim) == [20]  # one execution: the same operation id was asked again
    assert [(a["state"], a["error_class"]) for a in store.attempts(job_id)] == [("completed", None)]
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 20,
                               "available": 9_980}


def test_a_failed_read_when_collecting_books_nothing_and_reconciliation_books_it_once(
        store, admit, make_executor, make_router, sim) -> None:
    """Watch mode: the collect reads the prompt before its claim; a read that fails there claims the job
    without a charge and sends it to reconciliation, which books the run once."""
    job_id = admit(outputs=2)
    executor, router = make_executor(sim, watch=True), make_router(retry_base_seconds=0.0)
    assert executor.run(job_id) is True  # handed to the watcher
    wait_until(lambda: units(sim) == [20])  # the prompt ran, billed
    inject(sim, {"kind": "read_error", "path": "/history", "status": 503})
    with pytest.raises(AttemptFailed) as failed:
        executor.collect(job_id)
    assert router.route(failed.value) == "reconcile"
    job = store.job(job_id)
    assert (job["state"], job["charged"], job["attempt_charged"]) == ("reconciling", "0", "0")  # nothing booked
    assert reconcile(executor, router, job_id) == "reconciled"
    assert store.job(job_id)["state"] == "completed" and units(sim) == [20]
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 20,
                               "available": 9_980}


@pytest.mark.parametrize("recorded", ["current", "stale"])
def test_an_epoch_older_than_the_servers_never_proves_a_prompt_unrun(
        store, admit, make_executor, make_router, sim, recorded) -> None:
    """A worker records the epoch it read at most EPOCH_READ_S before a submission: one read before a
    restart the submission followed is another boot's. A prompt the server has no record of is proven
    unrun only under the epoch it has now; under an older one it is left to the careful path."""
    job_id = admit()
    executor = make_executor(sim, submit_settle_seconds=0.0, duplicate_cost_allowance=0)
    epoch = executor.fleet["sim"].epoch() if recorded == "current" else "an-earlier-boot"
    held = store.claim(job_id, worker="w", lease_ms=1000, operation_id="op-never-sent", servers={"sim": 4})
    store.mark_submit(held, epoch=epoch, lease_ms=1000)  # the request never reached the server
    assert store.begin_reconcile(job_id, reason="lease_expired", claim=held)
    outcome = reconcile(executor, make_router(retry_base_seconds=0.0), job_id)
    job = store.job(job_id)
    if recorded == "current":
        assert (outcome, job["state"], job["uncertain"]) == ("retry", "retry_wait", "0")  # proven unrun
    else:
        assert (job["state"], job["error_reason"], job["uncertain"]) == ("needs_review", "outcome_unknowable", "10")
    assert units(sim) == []


def test_a_lost_output_of_a_paid_run_goes_to_an_operator_without_a_second_run(
        store, settings, admit, make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "read_error", "path": "/view", "status": 404, "times": 100})
    executor = make_executor(sim, reconcile_interval_seconds=0.0, reconcile_max_seconds=0.3)
    router = make_router()
    assert attempt(executor, router, job_id) == "reconcile"
    sends = []
    deadline = time.monotonic() + 10
    while store.job(job_id)["state"] == "reconciling" and time.monotonic() < deadline:
        sends.append(sweeper(store, settings).sweep_once()["reconciles_sent"])
        assert reconcile(executor, router, job_id) in ("reconciled", "skipped")
        time.sleep(0.05)
    job = store.job(job_id)
    # a /view 404 after a completed run: paid for and gone, never the client's invalid input
    assert (job["state"], job["error_reason"]) == ("needs_review", "provider_output_lost")
    assert units(sim) == [10]
    # it ran and its charge was booked before the fetch failed: nothing is uncertain
    assert balanced(store) == {"allowance": 10_000, "reserved": 30, "uncertain": 0, "settled": 0,
                               "available": 9_970}
    assert job["charged"] == "10"


def test_a_reconcile_message_is_not_sent_again_while_one_is_waiting(store, settings, admit, make_executor,
                                                                    make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "drop"})
    assert attempt(make_executor(sim), make_router(), job_id) == "reconcile"
    broker = actors.broker.client
    broker.delete(RECONCILE_QUEUE)
    window = settings.outbox_grace_seconds
    assert sweeper(store, settings).sweep_once()["reconciles_sent"] == 1
    for ahead in (0.0, window / 2, window * 0.9):  # nobody took the message yet: no second one
        assert sweeper(store, settings, ahead=ahead).sweep_once()["reconciles_sent"] == 0
    assert broker.llen(RECONCILE_QUEUE) == 1
    assert sweeper(store, settings, ahead=window + 1).sweep_once()["reconciles_sent"] == 1  # it may be lost
    assert sweeper(store, settings, ahead=window + 2).sweep_once()["reconciles_sent"] == 0  # window doubled
    assert broker.llen(RECONCILE_QUEUE) == 2


def test_cancel_of_a_job_under_review_ends_it_and_no_operator_can_run_it_again(store, admit, make_executor,
                                                                               make_router, capsys) -> None:
    server = simulated.start(delay=0.2)
    try:
        job_id = admit()
        lost_in_a_restart(make_executor(server), make_router(), job_id, server)
        assert store.job(job_id)["state"] == "needs_review"
        assert store.cancel(job_id) == ("cancelled", "possible")
        assert cli.main(["review", "resolve", job_id, "--retry"], store=store) == 1
        assert units(server) == [10]
    finally:
        server.close()
    assert "not allowed while the job is cancelled" in capsys.readouterr().err
    assert store.redis.zcard(TenantKeys("acme").review) == 0
    # the uncertain 10 is settled as charged (the release policy); the rest is released
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 10, "available": 9_990}


def test_a_job_whose_deadline_passed_in_the_queue_is_never_submitted(store, admit, make_executor, sim) -> None:
    job_id = admit(deadline_s=1)
    time.sleep(1.05)
    assert make_executor(sim).run(job_id) is False
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["attempt_count"]) == ("failed", "deadline_exceeded", "0")
    assert units(sim) == []
    assert store.redis.zscore(TenantKeys("acme").dead, job_id) is not None
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 0, "available": 10_000}


def test_too_little_time_left_is_refused_at_claim(store, admit, make_executor, sim) -> None:
    job_id = admit(deadline_s=2)
    assert make_executor(sim, min_attempt_seconds=5.0).run(job_id) is False
    assert (store.job(job_id)["state"], units(sim)) == ("failed", [])


def test_a_queued_job_past_its_deadline_is_failed_by_the_sweeper(store, settings, admit) -> None:
    job_id = admit(deadline_s=1)
    done = sweeper(store, settings, ahead=settings.outbox_grace_seconds + 2).sweep_once()
    assert done["redelivered"] == 0 and store.job(job_id)["state"] == "failed"
    assert balanced(store)["reserved"] == 0


def test_every_change_of_owner_fences_the_previous_holder(store, admit) -> None:
    job_id = admit()
    worker = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op", servers={"sim": 1000})
    store.mark_submit(worker, epoch="e", lease_ms=60_000)
    store.begin_reconcile(job_id, reason="unknown_outcome", claim=worker)  # the worker hands over
    rec = store.claim_reconcile(job_id, worker="r1", lease_ms=60_000)
    store.reconcile_later(rec.claim, delay_ms=0)  # the first reconciler lets go
    second = store.claim_reconcile(job_id, worker="r2", lease_ms=60_000)
    generations = [worker.generation, rec.claim.generation, second.claim.generation]
    assert generations == [1, 3, 5]
    for stale in (worker, rec.claim):
        with pytest.raises(StaleLease):
            store.charge(stale, 10)
    assert store.charge(second.claim, 10) == 10
    job = store.job(job_id)
    # the uncertain 10 held at the hand-over was resolved by the charge itself
    assert (job["uncertain"], job["charged"], job["reserved"]) == ("0", "10", "20")
    assert store.redis.hget(keys.TenantKeys("acme").shard.stats, "stale_writes_rejected") == "2"


def test_a_lease_lives_on_redis_time_whatever_the_caller_clock_says(store, admit) -> None:
    job_id = admit()
    claim = store.claim(job_id, worker="w", lease_ms=30_000, operation_id="op", servers={"sim": 1000})
    expires = int(store.job(job_id)["lease_expires"])
    assert abs(expires - (store.server_ms() + 30_000)) < 2_000
    assert store.redis.zscore(JobKeys(job_id).tenant.leases, job_id) == expires
    assert claim.claimed_ms == expires - 30_000


def test_marking_the_submission_renews_the_lease(store, admit) -> None:
    job_id = admit()
    claim = store.claim(job_id, worker="w", lease_ms=1_000, operation_id="op", servers={"sim": 1000}, now_ms=10_000)
    store.mark_submit(claim, epoch="e", lease_ms=1_000, now_ms=10_900)
    assert store.job(job_id)["lease_expires"] == "11900"
    leases, wake = TenantKeys("acme").leases, TenantKeys("acme").shard.wake
    assert store.redis.zscore(leases, job_id) == 11_000  # the renewal is the record's: the index keeps the claim's
    store.redis.zadd(wake, {"acme": 20_000})  # as a sweeper's hold leaves it
    assert store.begin_reconcile(job_id, reason="lease_expired", now_ms=11_000) is False  # still alive
    # the sweeper found the entry early: it moved to the record's expiry, and so did the tenant's wake entry
    assert (store.redis.zscore(leases, job_id), store.redis.zscore(wake, "acme")) == (11_900, 11_900)
    assert store.job(job_id)["state"] == "running"
    assert store.begin_reconcile(job_id, reason="lease_expired", now_ms=11_899) is False
    assert store.begin_reconcile(job_id, reason="lease_expired", now_ms=11_900) is True  # expired: seen at once


class LateSubmit(ComfyUI):
    """The first POST /prompt reaches the provider only after our client gave up on it."""

    def __init__(self, server: simulated.SimServer) -> None:
        super().__init__(HttpTransport(server.url, timeout=1.0), price_per_output=server.sim.price_per_output)
        self.server = server

    def submit(self, operation_id, workflow, indices, *, front=False):
        inject(self.server, {"kind": "latency", "seconds": 2.5, "times": 1})
        return super().submit(operation_id, workflow, indices, front=front)


def test_no_record_yet_is_not_proof_while_the_submission_may_still_land(store, settings, admit, make_router,
                                                                         sim) -> None:
    job_id = admit()
    executor = Executor(store, single(LateSubmit(sim)), BlobStore(settings.blob_dir),
                        dataclasses.replace(settings, submit_settle_seconds=5.0))
    router = make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "reconcile"  # the POST timed out: unknown outcome
    assert reconcile(executor, router, job_id) == "reconciled"  # no record yet, but too soon to tell
    assert store.job(job_id)["state"] == "reconciling"
    wait_until(lambda: units(sim) == [10])  # the request lands late and runs
    assert reconcile(executor, router, job_id) == "reconciled"
    assert store.job(job_id)["state"] == "completed"
    assert units(sim) == [10]
    assert balanced(store)["settled"] == 10


def test_an_unreadable_queue_answer_is_never_taken_for_no_such_operation(store, admit, make_executor,
                                                                          make_router) -> None:
    server = simulated.start(delay=1.0)
    try:
        job_id = admit()
        inject(server, {"kind": "read_error", "path": "/queue", "status": 200, "times": 2})
        executor, router = make_executor(server), make_router(retry_base_seconds=0.0)
        assert attempt(executor, router, job_id) == "reconcile"
        assert reconcile(executor, router, job_id) == "reconciled"
        wait_until(lambda: reconcile(executor, router, job_id) == "reconciled"
                   and store.job(job_id)["state"] == "completed", timeout=10)
        assert units(server) == [10]
    finally:
        server.close()


def test_an_admission_whose_confirmation_failed_is_confirmed_by_the_sweeper(store, settings, tenant,
                                                                            make_executor, make_router, sim) -> None:
    class LosesTheConfirmation(Store):
        def confirm_published(self, *args, **kwargs) -> None:
            raise redis.ConnectionError("connection reset after the publish")

    tenant()
    body = {"kind": "image", "workflow": WORKFLOW, "outputs": 1}
    first = Admitter(LosesTheConfirmation(store.redis), Publisher(actors.broker), settings).submit("acme", "k", body)
    assert attempt(make_executor(sim), make_router(), first.job_id) == "done"
    sweeper(store, settings, ahead=settings.outbox_grace_seconds + 1).sweep_once()
    again = Admitter(store, Publisher(actors.broker), settings).submit("acme", "k", body)
    assert (again.status, again.replayed, again.job_id, again.body) == (202, True, first.job_id, first.body)


def test_reconciliation_that_keeps_failing_for_any_reason_ends_in_review(store, settings, admit, make_executor,
                                                                         make_router, sim, tmp_path) -> None:
    job_id = admit()
    inject(sim, {"kind": "drop"})
    assert attempt(make_executor(sim), make_router(), job_id) == "reconcile"
    (tmp_path / "not-a-dir").write_text("")
    broken = make_executor(sim, reconcile_interval_seconds=0.0, reconcile_max_seconds=0.5)
    broken.blobs = BlobStore(tmp_path / "not-a-dir" / "blobs")  # every blob write fails
    wait_until(lambda: units(sim) == [10])
    deadline = time.monotonic() + 10
    while store.job(job_id)["state"] == "reconciling" and time.monotonic() < deadline:
        assert broken.reconcile(job_id) in (True, False)
        time.sleep(0.1)
    job = store.job(job_id)
    assert (job["state"], job["error_reason"]) == ("needs_review", "reconcile_timed_out")
    assert units(sim) == [10] and job["charged"] == "10"


def test_a_deadline_that_passes_before_the_submission_stops_it(store, admit, make_executor, make_router,
                                                               sim) -> None:
    job_id = admit(deadline_s=2)  # the claim sees 2 s left: enough
    inject(sim, {"kind": "latency", "seconds": 2.5, "times": 1})  # then the epoch read takes 2.5 s
    assert attempt(make_executor(sim), make_router(), job_id) == "done"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["submitted"]) == ("failed", "deadline_exceeded", "0")
    assert units(sim) == []
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 0, "available": 10_000}


def test_a_late_first_reconciliation_still_asks_the_provider_and_books_the_charge(store, admit, make_executor,
                                                                                  make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "drop"})
    late = make_executor(sim, reconcile_max_seconds=0.0)  # every reconciliation is "too old" already
    assert attempt(late, make_router(), job_id) == "reconcile"
    wait_until(lambda: units(sim) == [10])
    assert reconcile(late, make_router(), job_id) == "reconciled"
    job = store.job(job_id)
    assert (job["state"], job["settled"], job["uncertain"]) == ("completed", "10", "0")


def test_a_submission_time_missing_from_the_record_is_not_taken_as_long_ago(store, settings, admit,
                                                                            make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "error_before"})  # refused, but the POST's 5xx leaves the outcome unknown
    executor = make_executor(sim, submit_settle_seconds=30.0)
    assert attempt(executor, make_router(), job_id) == "reconcile"
    store.redis.hdel(JobKeys(job_id).record, "submitted_at")  # a record written before the field existed
    assert reconcile(executor, make_router(), job_id) == "reconciled"
    assert store.job(job_id)["state"] == "reconciling"  # too soon after reconciliation began to call it proof
    assert units(sim) == []


def test_the_claim_hands_over_the_workflow_so_nothing_is_read_after_the_mark(store, settings, admit, make_executor,
                                                                              sim) -> None:
    calls: list[str] = []

    class Recording(Store):
        def claim(self, *args, **kwargs):
            claim = super().claim(*args, **kwargs)
            calls.append(f"claim {claim.inputs.workflow == WORKFLOW} {claim.inputs.outputs_requested}")
            return claim

        def mark_submit(self, *args, **kwargs):
            calls.append("mark_submit")
            return super().mark_submit(*args, **kwargs)

        def job(self, job_id):
            calls.append("job")
            return super().job(job_id)

        def workflow(self, job_id):
            calls.append("workflow")
            return super().workflow(job_id)

    job_id = admit(outputs=2)
    executor = make_executor(sim)
    executor.store = Recording(store.redis)
    assert executor.run(job_id) is True
    assert calls == ["claim True 2", "mark_submit"]  # no read between the mark and the submission
    assert store.job(job_id)["state"] == "completed" and sorted(store.outputs(job_id)) == [0, 1]


