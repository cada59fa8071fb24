"""The client against the whole stack as processes (provider, gunicorn, worker, watcher, sweeper):
one job per intent, a job followed to its end, outputs checked by their sha256, and a submission
the API admitted but never answered in time."""

from __future__ import annotations

import hashlib
import io

import orjson
import pytest
from reckon.client import Client, DeadlineExceeded, IntegrityError

from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import create_key, create_tenant
from tests.client.conftest import job_body, whole_stack


def listed(stack, api_key: str) -> list[str]:
    """The ids of the tenant's jobs, from the API."""
    status, _, raw = stack.api("GET", "/v1/jobs", Authorization=f"Bearer {api_key}")
    assert status == 200
    return [job["id"] for job in orjson.loads(raw)["jobs"]]


def test_submit_wait_and_download_checked_by_sha256(stack, proxy, redis_client, tmp_path) -> None:
    api_key = whole_stack(stack, redis_client, delay=0.05)
    client = Client(f"http://127.0.0.1:{stack.web_port}", api_key, deadline=30)

    job = client.submit("render-1", job_body(outputs=2))
    assert client.submit("render-1", job_body(outputs=2)) == job  # the same intent: the same job
    done = client.wait(job["id"], timeout=30)
    assert (done["state"], [o["index"] for o in done["outputs"]], listed(stack, api_key)) == (
        "completed", [0, 1], [job["id"]])

    folder = tmp_path / "out"
    folder.mkdir()
    entry = client.download(job["id"], 0, folder / "0.png")
    data = (folder / "0.png").read_bytes()
    assert entry == done["outputs"][0] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert len(data) == entry["bytes"] and data.startswith(b"\x89PNG")
    into = io.BytesIO()
    client.download(job["id"], 1, into)
    assert hashlib.sha256(into.getvalue()).hexdigest() == done["outputs"][1]["sha256"] != entry["sha256"]

    corrupting = proxy(stack.web_port, corrupt_outputs=True)  # one byte of every output's body flipped
    tampered = Client(corrupting.url, api_key, deadline=30)
    with pytest.raises(IntegrityError) as mismatch:
        tampered.download(job["id"], 1, folder / "1.png")
    assert (mismatch.value.expected, mismatch.value.actual != mismatch.value.expected) == (
        done["outputs"][1]["sha256"], True)
    untouched = io.BytesIO(b"kept")
    with pytest.raises(IntegrityError):
        tampered.download(job["id"], 1, untouched)
    assert untouched.getvalue() == b"kept"
    assert sorted(path.name for path in folder.iterdir()) == ["0.png"]  # no partial file anywhere
    assert len(corrupting.requests(b"GET /v1/jobs/" + job["id"].encode() + b"/outputs/1 ")) == 2  # not retried


def test_a_submission_admitted_but_not_answered_in_time_is_replayed_as_one_job(stack_with, proxy,
                                                                                redis_client) -> None:
    create_tenant(redis_client, "acme", 1_000)
    api_key = create_key(redis_client, "acme")
    stack = stack_with(RECKON_OUTBOX_GRACE_SECONDS="4")
    stack.start_web(pause_at="after_admit")  # the first admission is written, then its thread stops
    stack.start_sweeper()  # publishes it from the outbox after 4 s: its key's record turns from pending to done
    front = proxy(stack.web_port)
    client = Client(front.url, api_key, timeout=1.0, deadline=30)

    job = client.submit("slow-1", job_body())
    assert stack.pause_file("web").exists()
    posts = front.requests(b"POST /v1/jobs ")
    assert {post.header("Idempotency-Key") for post in posts} == {"slow-1"}
    assert len({bytes(post.request) for post in posts}) == 1  # every try the same bytes
    statuses = [post.status for post in posts]  # unanswered, then in progress until published, then replayed
    assert (statuses[0], set(statuses[1:-1]), statuses[-1]) == (None, {409}, 202), statuses
    assert b"urn:reckon:problem:idempotency-request-in-progress" in posts[1].response
    assert posts[-1].header("Idempotent-Replayed", answer=True) == "true"
    assert listed(stack, api_key) == [job["id"]]
    assert redis_client.zrange(TenantKeys("acme").jobs, 0, -1) == [job["id"]]
    with pytest.raises(DeadlineExceeded):  # no worker: it stays queued
        client.wait(job["id"], timeout=0.5)
