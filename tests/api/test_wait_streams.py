"""``Prefer: wait`` on the streams process (api/streams/waits.py) as deployed: gunicorn with uvicorn workers
on a free loopback port, its jobs ended by the scripts in this process. The same admission and problems
as the web process; a held request answers when its job ends, woken by the hub."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson

from pipeline.state.store import Store
from tests.conftest import wait_until

from .conftest import Streams, auth, job_body
from .test_wait import finish


def call(streams: Streams, method: str, path: str, key: str, body: Any = None,
         **headers: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    data = None if body is None else orjson.dumps(body)
    extra = {"Content-Type": "application/json"} if body is not None else {}
    status, got, raw = streams.request(method, path, data, {**auth(key), **extra, **headers})
    return status, got, orjson.loads(raw)


def held(streams: Streams, path: str, key: str, **headers: str) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []

    def run() -> None:
        answers.append(call(streams, "GET", path, key, **headers))
        answers.append(time.time())

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answers


def test_a_post_is_admitted_and_held_until_its_job_ends(streams: Streams, tenant, store: Store) -> None:
    key = tenant()
    status, headers, first = call(streams, "POST", "/v1/jobs", key, job_body(), **{"Idempotency-Key": "one",
                                                                                 "Prefer": "wait=1"})
    assert (status, first["state"], headers["preference-applied"]) == (202, "queued", "wait=1")
    assert headers["location"] == f"/v1/jobs/{first['id']}"
    before = lranges(store)
    thread, answers = held(streams, f"/v1/jobs/{first['id']}", key, Prefer="wait=30")
    wait_until(lambda: lranges(store) >= before + 2)  # it joined the job's room and read the job: it waits
    finish(store, first["id"])
    ended = time.time()
    thread.join(20)
    (status, headers, view), arrived = answers
    assert (status, view["state"], headers["preference-applied"], headers["vary"]) == (200, "completed", "wait=30",
                                                                                       "Prefer")
    assert arrived >= ended
    status, headers, replay = call(streams, "POST", "/v1/jobs", key, job_body(), **{"Idempotency-Key": "one",
                                                                                  "Prefer": "wait"})
    assert (status, replay["state"], headers["idempotent-replayed"], headers["preference-applied"]) == (
        200, "completed", "true", "wait=60")


def lranges(store: Store) -> int:
    """LRANGEs Redis has served: a held request's first read of its job (``Hub.snapshot``) sends two, and
    nothing else of these tests sends one."""
    return int(store.redis.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))


def test_refusals_are_the_web_processes_and_a_bad_preference_is_ignored(streams: Streams, tenant) -> None:
    key = tenant()
    status, _, problem = call(streams, "POST", "/v1/jobs", key, job_body())
    assert (status, problem["type"]) == (400, "urn:reckon:problem:idempotency-key-invalid")
    status, _, problem = call(streams, "POST", "/v1/jobs", key, job_body(outputs=0), **{"Idempotency-Key": "bad"})
    assert (status, problem["type"], problem["field"]) == (422, "urn:reckon:problem:invalid-job", "outputs")
    status, headers, view = call(streams, "POST", "/v1/jobs", key, job_body(), **{"Idempotency-Key": "two",
                                                                                "Prefer": "wait=soon"})
    assert (status, view["state"], "preference-applied" in headers) == (202, "queued", False)
    status, _, problem = call(streams, "POST", "/v1/jobs", key, job_body(outputs=2), **{"Idempotency-Key": "two"})
    assert (status, problem["type"]) == (422, "urn:reckon:problem:idempotency-key-reused")
    status, headers, listed = call(streams, "GET", f"/v1/jobs/{view['id']}", key, Prefer="wait=x")
    assert (status, listed["state"], "preference-applied" in headers) == (200, "queued", False)
    status, headers, listed = call(streams, "GET", f"/v1/jobs/{view['id']}", key, Prefer="wait=1")
    assert (status, listed["state"], headers["preference-applied"]) == (200, "queued", "wait=1")
    status, _, problem = call(streams, "GET", f"/v1/jobs/{view['id']}", tenant("other"), Prefer="wait=1")
    assert (status, problem["type"]) == (404, "urn:reckon:problem:job-not-found")
