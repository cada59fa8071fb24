"""Crash tests: real processes stopped at named fault points and killed with SIGKILL.

Each checks the job's final state, its attempts, the tenant ledger and the simulated
provider's charge ledger (the ground truth of what was paid).
"""

from __future__ import annotations

import threading
from urllib.request import Request, urlopen

import orjson
import pytest

from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 2}


def setup(stack, redis_client) -> dict[str, str]:
    create_tenant(redis_client, "acme", 1_000)
    return {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}


def submit(stack, auth: dict[str, str], key: str = "crash-1") -> str:
    status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth, **{"Idempotency-Key": key})
    assert status == 202
    return headers["location"].rsplit("/", 1)[1]


def submitted_to(stack, redis_client, *, delay: float, pause_at: str | None = None) -> str:
    """A whole stack whose provider takes ``delay`` per prompt (the worker stopping at ``pause_at``),
    and the id of one job submitted to it."""
    auth = setup(stack, redis_client)
    stack.start_provider(delay=delay)
    stack.start_web()
    stack.start_worker(pause_at=pause_at)
    stack.start_sweeper()
    return submit(stack, auth)


def finished(store: Store, job_id: str) -> bool:
    return (store.job(job_id) or {}).get("state") in ("completed", "failed", "needs_review")


def test_worker_killed_after_submission_is_reconciled_without_a_second_charge(stack, redis_client, store) -> None:
    job_id = submitted_to(stack, redis_client, delay=0.3, pause_at="after_submit")
    stack.kill_when_paused("worker")  # the prompt is with the provider; the worker is gone
    stack.start_worker()
    wait_until(lambda: finished(store, job_id), timeout=40)
    job = store.job(job_id)
    assert (job["state"], job["attempt_count"]) == ("completed", "1")
    assert [(a["state"], a.get("reconciled")) for a in store.attempts(job_id)] == [("completed", True)]
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert stack.charges()["total_units"] == 20 and len(stack.charges()["charges"]) == 1
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}


def collecting_watcher(stack, redis_client, *, delay: float, pause_at: str) -> str:
    """A whole stack whose watcher, which collects the prompts it hears end (pipeline/work/collecting.py),
    stops at ``pause_at``; the id of one job submitted to it."""
    auth = setup(stack, redis_client)
    stack.start_provider(delay=delay)
    stack.start_web()
    stack.start_worker(watcher=False)
    stack.start_watcher(pause_at=pause_at)
    stack.start_sweeper()
    return submit(stack, auth)


def blobs(stack) -> list[str]:
    """The names in the stack's blob directory (every blob stored, and any temporary file)."""
    root = stack.logs.parent / "blobs"
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_watcher_killed_after_storing_outputs_completes_without_a_provider_call(stack, redis_client, store) -> None:
    job_id = collecting_watcher(stack, redis_client, delay=0.0, pause_at="after_outputs")
    stack.kill_when_paused("watcher")  # its collect stored both outputs; the job is not finished
    stored = store.outputs(job_id)
    assert sorted(stored) == [0, 1] and store.job(job_id)["state"] == "running"
    on_disk = blobs(stack)
    assert on_disk == sorted(record["sha256"] for record in stored.values())
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert store.job(job_id)["state"] == "completed"
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert store.outputs(job_id) == stored and blobs(stack) == on_disk  # stored once
    assert len(stack.charges()["charges"]) == 1  # reconciliation found it done: no new provider call
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}


def test_api_killed_between_admission_and_publish_still_runs_the_job(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider()
    stack.start_web(pause_at="after_admit")
    def post() -> None:
        try:
            stack.api("POST", "/v1/jobs", BODY, timeout=30, **auth, **{"Idempotency-Key": "crash-1"})
        except OSError:
            pass  # the server died mid-request, as it should in this test

    client = threading.Thread(target=post)
    client.start()
    stack.kill_when_paused("web")  # the job and its reservation are written; no message was sent
    client.join(timeout=30)
    jobs = store.redis.zrange(TenantKeys("acme").jobs, 0, -1)
    assert len(jobs) == 1 and store.job(jobs[0])["state"] == "queued"
    assert store.redis.zcard(TenantKeys("acme").outbox) == 1
    stack.start_worker()
    stack.start_sweeper()
    wait_until(lambda: finished(store, jobs[0]), timeout=40)
    assert store.job(jobs[0])["state"] == "completed"
    stack.start_web()
    status, headers, body = stack.api("POST", "/v1/jobs", BODY, **auth, **{"Idempotency-Key": "crash-1"})
    assert (status, headers["idempotent-replayed"], orjson.loads(body)["id"]) == (202, "true", jobs[0])
    assert len(stack.charges()["charges"]) == 1


def at_the_watcher(stack, redis_client, store, delay: float) -> str:
    """A whole stack whose provider takes ``delay`` per prompt; a job submitted and handed to the watcher."""
    job_id = submitted_to(stack, redis_client, delay=delay)
    wait_until(lambda: (store.job(job_id) or {}).get("lease_owner") == "watcher", timeout=20)
    return job_id


def test_watcher_killed_mid_render_is_reconciled_without_a_second_charge(stack, redis_client, store) -> None:
    job_id = at_the_watcher(stack, redis_client, store, delay=3.0)
    stack.kill("watcher")  # nobody renews the lease now: it expires, and reconciliation asks the server
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert store.job(job_id)["state"] == "completed"
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert len(stack.charges()["charges"]) == 1
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}


def test_a_dropped_websocket_falls_back_to_history_and_loses_nothing(stack, redis_client, store) -> None:
    job_id = at_the_watcher(stack, redis_client, store, delay=1.5)
    urlopen(Request(f"http://127.0.0.1:{stack.sim_port}/sim/ws-drop", data=b"{}", method="POST"), timeout=5).close()
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "completed"]  # the lease held
    assert len(stack.charges()["charges"]) == 1 and store.ledger("acme")["settled"] == 20


@pytest.mark.parametrize("point", ["before_collect", "collect_claimed"])
def test_watcher_killed_while_collecting_completes_without_a_provider_call(stack, redis_client, store,
                                                                             point: str) -> None:
    """Killed with the end heard and the collect not begun (the job still watched: its lease lapses) or
    with the collect claimed (a collect's lease): the sweeper and a worker reconcile it from the server's
    record (no watcher runs), its outputs stored once, its run paid once."""
    job_id = collecting_watcher(stack, redis_client, delay=0.5, pause_at=point)
    stack.kill_when_paused("watcher")  # nothing is stored yet
    assert store.outputs(job_id) == {} and store.job(job_id)["state"] == "running"
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert store.job(job_id)["state"] == "completed" and sorted(store.outputs(job_id)) == [0, 1]
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert len(stack.charges()["charges"]) == 1 and blobs(stack) == sorted(
        record["sha256"] for record in store.outputs(job_id).values())
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20,
                                    "available": 980}
