"""Failures by evidence, in process: a real redis-server, the simulated ComfyUI with injected
faults over loopback HTTP, the executor and the router. Provider charges come from its ledger."""

from __future__ import annotations

import threading
import time
from urllib.request import Request, urlopen

import orjson
import pytest

from pipeline.errors import AttemptFailed, InsufficientAllowance
from pipeline.operate import cli
from pipeline.providers import sim as simulated
from pipeline.state import keys
from pipeline.state.jobs import job_view
from pipeline.state.keys import TenantKeys
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True

#: The provider's answer to the epoch read before submission is lost: transient, nothing was sent.
FAILS_BEFORE_SENDING = {"kind": "read_error", "path": "/system_stats", "status": 0, "times": 1000}


def inject(server: simulated.SimServer, *faults: dict) -> None:
    body = orjson.dumps({"faults": list(faults)})
    with urlopen(Request(f"{server.url}/sim/faults", data=body, method="POST"), timeout=5) as resp:
        assert resp.status == 200


def attempt(executor, router, job_id: str) -> str:
    """One delivery of the job's message: run it and route a failure as the middleware does."""
    try:
        return "done" if executor.run(job_id) else "skipped"
    except AttemptFailed as failed:
        return router.route(failed)


def reconcile(executor, router, job_id: str) -> str:
    try:
        return "reconciled" if executor.reconcile(job_id) else "skipped"
    except AttemptFailed as failed:
        return router.route(failed)


def sweep(store, settings, *, ahead: float = 0.0):
    return Sweeper(store, Publisher(actors.broker), settings, clock=lambda: time.time() + ahead).sweep_once()


def units(server: simulated.SimServer) -> list[int]:
    with server.sim.cond:
        return [c["units"] for c in server.sim.charges]


def balanced(store) -> dict[str, int]:
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    return ledger


def test_dropped_connection_is_reconciled_and_paid_once(store, admit, make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "drop"})
    executor, router = make_executor(sim), make_router()
    assert attempt(executor, router, job_id) == "reconcile"
    job = store.job(job_id)
    assert (job["state"], job["uncertain"]) == ("reconciling", "10")
    assert balanced(store)["uncertain"] == 10
    wait_until(lambda: units(sim) == [10])
    assert reconcile(executor, router, job_id) == "reconciled"
    assert store.job(job_id)["state"] == "completed"
    assert units(sim) == [10]  # exactly one charge: nothing was submitted again
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 10,
                                    "available": 9_990}
    assert [(a["state"], a.get("reconciled")) for a in store.attempts(job_id)] == [("completed", True)]


def test_500_after_execution_is_reconciled_not_repaid(store, admit, make_executor, make_router, sim) -> None:
    job_id = admit(outputs=2)
    inject(sim, {"kind": "error_after"})
    executor, router = make_executor(sim), make_router()
    assert attempt(executor, router, job_id) == "reconcile"
    wait_until(lambda: reconcile(executor, router, job_id) == "reconciled" and
               store.job(job_id)["state"] == "completed")
    assert units(sim) == [20]
    assert balanced(store)["settled"] == 20


def test_500_before_execution_is_proven_unexecuted_and_retried(store, settings, admit, make_executor, make_router,
                                                               sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "error_before"})
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "reconcile"
    # Same provider epoch, no record of the operation: it never executed.
    assert reconcile(executor, router, job_id) == "retry"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["uncertain"]) == ("retry_wait", "not_executed", "0")
    assert sweep(store, settings)["retries_promoted"] == 1
    assert attempt(executor, router, job_id) == "done"
    assert units(sim) == [10]
    assert [a["state"] for a in store.attempts(job_id)] == ["failed", "completed"]
    assert balanced(store)["settled"] == 10


def test_rate_limit_waits_at_least_retry_after(store, settings, admit, make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "rate_limit", "retry_after": 3})
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.01)
    before = int(time.time() * 1000)
    assert attempt(executor, router, job_id) == "retry"
    job = store.job(job_id)
    assert (job["state"], job["error_class"]) == ("retry_wait", "rate_limited")
    assert int(job["retry_at"]) >= before + 3000
    assert sweep(store, settings, ahead=2.0)["retries_promoted"] == 0  # not before Retry-After
    assert sweep(store, settings, ahead=3.5)["retries_promoted"] == 1
    assert attempt(executor, router, job_id) == "done"
    assert units(sim) == [10]


def test_policy_rejection_is_terminal_and_dead_lettered(store, admit, make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "policy"})
    assert attempt(make_executor(sim), make_router(), job_id) == "dead_letter"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["attempt_count"]) == ("failed", "policy_rejected", "1")
    assert store.redis.zrange(TenantKeys("acme").dead, 0, -1) == [job_id]
    assert units(sim) == [] and store.redis.zcard(TenantKeys("acme").retry) == 0
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 0, "available": 10_000}


def test_auth_failure_marks_that_server_and_stops_dispatch_to_it_until_cleared(
        store, settings, admit, make_executor, make_router, sim) -> None:
    first, second = admit("k1"), admit("k2")
    inject(sim, {"kind": "auth"})
    executor, router = make_executor(sim), make_router()
    assert attempt(executor, router, first) == "retry"
    assert store.provider_block("sim") == "provider_credentials"
    assert store.job(first)["state"] == "retry_wait" and store.job(first)["attempts_allowed"] == "4"  # not its fault
    # refused before any work: the attempt sent nothing, and its submit mark is taken back
    assert [(a["state"], a["submitted_at"]) for a in store.attempts(first)] == [("not_sent", None)]
    assert store.job(first)["submitted"] == "0"
    assert attempt(executor, router, second) == "skipped"  # parked: the server is not called
    assert (store.job(second)["state"], store.job(second).get("attempt_count", "0")) == ("queued", "0")
    # queued again (and parked at its claim); the parked one is not sent again past its window: it has no
    # message to lose, and a freed slot calls it (lua/redeliver.lua)
    assert sweep(store, settings, ahead=60) == {"retries_promoted": 1}
    assert attempt(executor, router, first) == "skipped"
    assert store.redis.zcard(keys.TenantKeys("acme").shard.parked) == 2
    assert store.clear_provider("sim")
    assert sweep(store, settings, ahead=60)["unparked"] == 2
    assert [attempt(executor, router, job) for job in (first, second)] == ["done", "done"]
    assert units(sim) == [10, 10]
    assert [a["state"] for a in store.attempts(first)] == ["not_sent", "completed"]
    assert job_view(store.job(first), {})["attempt_count"] == 1  # one submission
    stats = store.redis.hgetall(keys.TenantKeys("acme").shard.stats)
    assert (stats["attempts:interactive:1"], stats["attempts_sum:interactive"]) == ("2", "2")  # and so counted


def test_retries_across_jobs_stay_within_the_shared_budget(store, settings, admit, make_executor,
                                                           make_router) -> None:
    dead = simulated.start()
    inject(dead, FAILS_BEFORE_SENDING)  # transient, 100% of the time
    jobs = [admit(f"k{i}", deadline_s=3600) for i in range(6)]
    executor = make_executor(dead)
    router = make_router(retry_budget_tokens=20, retry_cost_tokens=5, retry_base_seconds=0.0)
    for _ in range(4):
        for job_id in jobs:
            if store.job(job_id)["state"] == "queued":
                attempt(executor, router, job_id)
        sweep(store, settings, ahead=1)
    retries = sum(1 for job_id in jobs for e in store.events(job_id) if e["to"] == "retry_wait")
    assert retries == 4  # 20 tokens / 5 per retry, across all six jobs
    errors = sorted(store.job(j)["error_class"] for j in jobs)
    assert errors.count("retry_budget_exhausted") == 6 - errors.count("attempts_exhausted")
    assert all(store.job(j)["state"] == "failed" for j in jobs)
    assert balanced(store)["reserved"] == 0 and balanced(store)["settled"] == 0
    dead.close()


def test_a_retry_that_would_pass_the_deadline_fails_now(store, admit, make_executor, make_router, sim) -> None:
    job_id = admit(deadline_s=5)
    inject(sim, FAILS_BEFORE_SENDING)
    assert attempt(make_executor(sim), make_router(retry_base_seconds=10.0), job_id) == "dead_letter"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["error_reason"]) == ("failed", "deadline_exceeded", "transient")
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 0, "available": 10_000}


def test_partial_outputs_survive_and_only_missing_ones_are_asked_for(
        store, settings, admit, make_executor, make_router, sim) -> None:
    job_id = admit(outputs=3)
    inject(sim, {"kind": "partial", "produce": 1})
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "retry"
    first = store.outputs(job_id)
    assert sorted(first) == [0]
    assert sweep(store, settings)["retries_promoted"] == 1
    assert attempt(executor, router, job_id) == "done"
    with sim.sim.cond:
        asked = [entry["prompt"][3]["reckon_outputs"] for entry in sim.sim.history.values()]
    assert asked == [[0, 1, 2], [1, 2]]
    assert store.outputs(job_id)[0] == first[0]  # the first attempt's output is kept
    assert units(sim) == [10, 20]
    assert balanced(store)["settled"] == 30


def lost_in_a_restart(executor, router, job_id: str, server: simulated.SimServer) -> None:
    """The answer to the submission is lost, the prompt runs (charged), then the provider
    restarts and forgets it: reconciliation cannot know what happened."""
    inject(server, {"kind": "drop"})
    assert attempt(executor, router, job_id) == "reconcile"
    wait_until(lambda: units(server) == [10])
    server.sim.restart()
    assert reconcile(executor, router, job_id) == "reconciled"


def test_restarted_provider_leaves_the_outcome_to_review(store, admit, make_executor, make_router, capsys) -> None:
    server = simulated.start(delay=0.2)
    try:
        job_id = admit()
        lost_in_a_restart(make_executor(server), make_router(), job_id, server)
    finally:
        server.close()
    job = store.job(job_id)
    assert (job["state"], job["error_reason"], job["uncertain"]) == ("needs_review", "outcome_unknowable", "10")
    assert balanced(store)["uncertain"] == 10
    assert cli.main(["review", "resolve", job_id, "--failed"], store=store) == 0
    capsys.readouterr()
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 10, "available": 9_990}
    assert store.job(job_id)["state"] == "failed"


def test_cancel_before_submission_never_calls_the_provider(store, admit, make_executor, sim) -> None:
    job_id = admit()
    assert store.cancel(job_id, now_ms=int(time.time() * 1000)) == ("cancelled", "none")
    assert store.cancel(job_id, now_ms=int(time.time() * 1000)) == ("cancelled", "none")  # harmless twice
    assert make_executor(sim).run(job_id) is False
    assert units(sim) == [] and balanced(store)["reserved"] == 0
    assert [e["to"] for e in store.events(job_id)] == ["queued", "cancelled"]


def test_cancel_while_running_stops_new_steps_and_reports_the_effect(store, admit, make_executor,
                                                                     make_router) -> None:
    server = simulated.start(delay=2.0)
    try:
        job_id = admit()
        executor = make_executor(server)
        runner = threading.Thread(target=executor.run, args=(job_id,))
        runner.start()
        wait_until(lambda: server.sim.queue()["queue_running"])
        assert store.cancel(job_id, now_ms=int(time.time() * 1000)) == ("running", "possible")
        runner.join(timeout=10)
    finally:
        server.close()
    job = store.job(job_id)
    assert (job["state"], job["external_effect"]) == ("cancelled", "occurred")
    assert len(store.outputs(job_id)) == 1  # what was paid for is kept
    assert balanced(store)["settled"] == 10


def test_supersedes_cancels_an_undispatched_job(store, admit) -> None:
    older = admit("k1")
    newer = admit("k2", supersedes=older)
    assert store.job(older)["state"] == "cancelled" and store.events(older)[-1]["reason"] == "superseded"
    assert store.job(newer)["state"] == "queued"
    assert balanced(store)["reserved"] == 30


def test_dead_letter_replay_reserves_again(store, admit, make_executor, make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "policy"})
    executor, router = make_executor(sim), make_router()
    assert attempt(executor, router, job_id) == "dead_letter"
    store.redis.hset(TenantKeys("acme").ledger, "allowance", 29)
    with pytest.raises(InsufficientAllowance):
        store.replay(job_id, now_ms=int(time.time() * 1000))
    store.redis.hset(TenantKeys("acme").ledger, "allowance", 10_000)
    store.replay(job_id, now_ms=int(time.time() * 1000))
    assert store.job(job_id)["state"] == "queued" and balanced(store)["reserved"] == 30
    assert attempt(executor, router, job_id) == "done"
    assert [a["state"] for a in store.attempts(job_id)] == ["failed", "completed"]
    assert units(sim) == [10] and balanced(store)["settled"] == 10


def test_a_partial_failure_found_by_reconciliation_is_charged_for_what_it_made(
        store, admit, make_executor, make_router, sim) -> None:
    job_id = admit(outputs=3)
    inject(sim, {"kind": "drop"}, {"kind": "partial", "produce": 1})
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "reconcile"
    assert balanced(store)["uncertain"] == 30  # three outputs may have been made
    wait_until(lambda: units(sim) == [10])
    assert reconcile(executor, router, job_id) == "retry"  # it failed after one output
    job = store.job(job_id)
    assert (job["state"], job["uncertain"], job["charged"]) == ("retry_wait", "0", "10")
    assert sorted(store.outputs(job_id)) == [0]
    assert balanced(store) == {"allowance": 10_000, "reserved": 90, "uncertain": 0, "settled": 0, "available": 9_910}


def test_outputs_copied_before_a_failed_copy_are_recorded_and_the_rest_reconciled(
        store, admit, make_executor, make_router, sim) -> None:
    """An attempt records each output right after its copy: one whose copy fails partway has the
    outputs copied before it recorded, and reconciliation records the rest."""
    job_id = admit(outputs=3)
    inject(sim, {"kind": "read_error", "path": "/view", "after": 1})  # the second output's read fails
    executor, router = make_executor(sim), make_router(retry_base_seconds=0.0)
    assert attempt(executor, router, job_id) == "reconcile"
    assert sorted(store.outputs(job_id)) == [0]
    first = store.outputs(job_id)[0]
    assert reconcile(executor, router, job_id) == "reconciled"
    assert store.job(job_id)["state"] == "completed"
    assert sorted(store.outputs(job_id)) == [0, 1, 2] and store.outputs(job_id)[0] == first
    assert units(sim) == [30]
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 30,
                               "available": 9_970}


def test_unknowable_outcome_within_the_duplicate_allowance_is_retried_and_paid(
        store, settings, admit, make_executor, make_router) -> None:
    server = simulated.start(delay=0.1)
    try:
        job_id = admit()
        inject(server, {"kind": "drop"})
        executor = make_executor(server, duplicate_cost_allowance=10)
        router = make_router(retry_base_seconds=0.0)
        assert attempt(executor, router, job_id) == "reconcile"
        wait_until(lambda: units(server) == [10])
        server.sim.restart()
        assert reconcile(executor, router, job_id) == "retry"
        job = store.job(job_id)
        assert (job["charged"], job["error_class"]) == ("10", "possible_duplicate")  # paid for, and said so
        assert [a["error_class"] for a in store.attempts(job_id)] == ["possible_duplicate"]
        assert sweep(store, settings)["retries_promoted"] == 1
        assert attempt(executor, router, job_id) == "done"
    finally:
        server.close()
    assert units(server) == [10, 10]
    assert balanced(store)["settled"] == 20


def test_an_unresolved_review_expires_as_failed_and_charged(store, settings, admit, make_executor,
                                                            make_router) -> None:
    server = simulated.start(delay=0.1)
    try:
        job_id = admit()
        inject(server, {"kind": "drop"})
        executor, router = make_executor(server), make_router()
        attempt(executor, router, job_id)
        wait_until(lambda: units(server) == [10])
        server.sim.restart()
        reconcile(executor, router, job_id)
    finally:
        server.close()
    assert store.job(job_id)["state"] == "needs_review"
    assert sweep(store, settings, ahead=settings.review_expiry_seconds - 60)["reviews_expired"] == 0
    assert sweep(store, settings, ahead=settings.review_expiry_seconds + 60)["reviews_expired"] == 1
    job = store.job(job_id)
    assert (job["state"], job["error_reason"]) == ("failed", "review_expired")
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 10, "available": 9_990}


