"""Batches with real processes: a batch admitted while a worker runs completes each admitted job once (submitted, read and
cancelled through the client);
the web process killed after a batch's admissions (fault point ``batch_after_admit``, before any
message is sent or the batch's record written) leaves its jobs to the sweeper's outbox, as a job posted
alone; its retry with the same key answers the same jobs, which run once each."""

from __future__ import annotations

import threading

import orjson

from pipeline.state.keys import TenantKeys
from reckon.client import Client
from pipeline.state.store import Store
from tests.conftest import wait_until

from .test_crashes import BODY, finished, setup

JOBS = [BODY | {"workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": i}}}} for i in range(8)]


def post(stack, auth: dict[str, str], bodies: list, key: str = "batch-1") -> tuple[int, dict[str, str], dict]:
    status, headers, body = stack.api("POST", "/v1/batches", {"jobs": bodies}, timeout=30, **auth,
                                      **{"Idempotency-Key": key})
    return status, headers, orjson.loads(body)


def all_finished(store: Store, job_ids: list[str]) -> bool:
    return all(finished(store, job_id) for job_id in job_ids)


def test_a_batch_admitted_while_a_worker_runs_completes_every_admitted_job_once(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider()
    stack.start_web()
    stack.start_worker()
    client = Client(f"http://127.0.0.1:{stack.web_port}", auth["Authorization"].removeprefix("Bearer "))
    batch = client.submit_batch("batch-1", [*JOBS, {"kind": "image"}])
    job_ids = [item["job"]["id"] for item in batch["items"][:8]]
    assert batch["items"][8]["problem"]["field"] == "workflow"
    assert store.redis.zcard(TenantKeys("acme").outbox) == 0  # sent in one pipeline, confirmed in another
    wait_until(lambda: all_finished(store, job_ids), timeout=40)
    assert [(store.job(j)["state"], store.job(j)["attempt_count"]) for j in job_ids] == [("completed", "1")] * 8
    assert len(stack.charges()["charges"]) == 8
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 160,
                                    "available": 840}
    counts = client.batch(batch["id"])["counts"]
    assert (counts["completed"], counts["refused"], sum(counts.values())) == (8, 1, 9)
    assert client.cancel_batch(batch["id"])["cancel_requested"] == 0  # nothing unfinished
    assert client.submit_batch("batch-1", [*JOBS, {"kind": "image"}]) == batch


def test_web_killed_mid_batch_is_retried_to_the_same_jobs_each_run_once(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider()
    stack.start_web(pause_at="batch_after_admit")
    first = threading.Thread(target=lambda: _ignore_errors(post, stack, auth, JOBS))
    first.start()
    stack.kill_when_paused("web")  # every item admitted and in the outbox; no message sent, no record written
    first.join(timeout=30)
    written = set(store.redis.zrange(TenantKeys("acme").jobs, 0, -1))
    assert len(written) == 8 and store.redis.zcard(TenantKeys("acme").outbox) == 8
    stack.start_web()
    status, _, early = post(stack, auth, JOBS)  # its items wait in the outbox: as a job posted alone, 409
    assert (status, early["type"]) == (409, "urn:reckon:problem:idempotency-request-in-progress")
    stack.start_sweeper()  # publishes what the outbox holds once its grace (1 s) is over
    wait_until(lambda: store.redis.zcard(TenantKeys("acme").outbox) == 0, timeout=20)
    status, headers, batch = post(stack, auth, JOBS)
    assert (status, "idempotent-replayed" in headers) == (202, False)  # its record is written now
    job_ids = [item["job"]["id"] for item in batch["items"]]
    assert set(job_ids) == written and store.ledger("acme")["reserved"] == 8 * 60
    stack.start_worker()
    wait_until(lambda: all_finished(store, job_ids), timeout=40)
    assert [store.job(j)["state"] for j in job_ids] == ["completed"] * 8
    assert len(stack.charges()["charges"]) == 8 and store.redis.zcard(TenantKeys("acme").jobs) == 8
    status, headers, again = post(stack, auth, JOBS)
    assert (status, headers["idempotent-replayed"], again["id"]) == (202, "true", batch["id"])
    assert [item["job"]["id"] for item in again["items"]] == job_ids


def _ignore_errors(call, *args) -> None:
    try:
        call(*args)
    except OSError:
        pass  # the server died mid-request, as it should
