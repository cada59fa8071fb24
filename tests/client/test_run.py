"""``Client.run`` over the real stack: submitted and held on the streams process until the job ends, across
a SIGKILL and restart of that process (the client asks again with the same key: one job, one charge); and
against a web process that holds no request (no slot: ``RECKON_SSE_MAX_STREAMS=0``), by polling."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import orjson
from reckon.client import Client

from tests.api.conftest import Streams
from tests.client.conftest import job_body, whole_stack
from tests.conftest import wait_until


def completed_at(stack: Any, api_key: str, job_id: str) -> float:
    """When the job's ``completed`` event was written (s since the epoch, Redis's clock)."""
    status, _, raw = stack.api("GET", f"/v1/jobs/{job_id}/events?after=0", Authorization=f"Bearer {api_key}")
    assert status == 200
    (event,) = [e for e in orjson.loads(raw)["events"] if e["type"] == "state" and e["to"] == "completed"]
    return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()


def test_run_is_answered_when_the_job_ends_across_a_restart_of_the_streams_process(stack, redis_client,
                                                                                  tmp_path) -> None:
    api_key = whole_stack(stack, redis_client, delay=3.0)
    (tmp_path / "streams").mkdir()
    streams = Streams(tmp_path / "streams")
    streams.start()
    try:
        client = Client(f"http://127.0.0.1:{stack.web_port}", api_key, streams_url=streams.url, deadline=30)
        done: list[Any] = []
        thread = threading.Thread(target=lambda: done.extend([client.run("run-1", job_body(), wait=60), time.time()]))
        thread.start()
        wait_until(stack.sim_running, timeout=20)  # the job runs, its submission held on the streams process
        streams.stop(graceful=False)  # SIGKILL: the held request's connection is cut
        streams.start()  # the same port: the client asks again with the same key, and is held again
        thread.join(30)
        view, arrived = done
    finally:
        streams.stop(graceful=False)
    assert (view["state"], len(view["outputs"])) == ("completed", 1)
    assert completed_at(stack, api_key, view["id"]) <= arrived
    assert len(stack.charges()["charges"]) == 1  # ran once
    status, _, raw = stack.api("GET", "/v1/jobs", Authorization=f"Bearer {api_key}")
    assert [job["id"] for job in orjson.loads(raw)["jobs"]] == [view["id"]]  # one job


def test_run_polls_where_no_request_is_held(stack_with, proxy, redis_client) -> None:
    stack = stack_with(RECKON_SSE_MAX_STREAMS="0")  # no slot: the web process holds no request
    api_key = whole_stack(stack, redis_client, delay=0.5)
    front = proxy(stack.web_port)
    view = Client(front.url, api_key, deadline=30).run("run-2", job_body(), wait=60)
    assert view["state"] == "completed"
    posts = front.requests(b"POST /v1/jobs")
    assert [p.header("Prefer") for p in posts] == ["wait=60"]
    assert b"Preference-Applied" not in bytes(posts[0].response)
    polls = front.requests(f"GET /v1/jobs/{view['id']}".encode())
    assert polls and all(p.header("Prefer") is None for p in polls)
