"""GET /v1/jobs/{id}/events (?after=) and /events/stream (Server-Sent Events, Last-Event-ID resume)."""

from __future__ import annotations

import dataclasses
import http.client
import threading
import time
from typing import Any

import orjson
import pytest
from falcon import testing

from api import sse
from api.app import create_app
from pipeline.claims import Claim
from pipeline.state import progress
from pipeline.state.store import Store

from .conftest import auth


@pytest.fixture
def running(submit, tenant, store: Store):
    """Factory: a job of tenant acme claimed by a worker, and acme's key."""

    def make() -> tuple[Claim, str]:
        key = tenant("acme")
        job_id = submit(key).json["id"]
        held = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-1", servers={"s1": 4})
        assert held is not None
        return held, key

    return make


def report(store: Store, held: Claim, *values: int) -> None:
    for value in values:
        assert progress.record(store.scripts, held.job_id, held.attempt, held.operation_id, "3", value, 10)


def messages(body: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(id, event, data) of every SSE message in a body; comments and the retry field are left out."""
    found = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if "id" in fields:
            found.append((int(fields["id"]), fields["event"], orjson.loads(fields["data"])))
    return found


def stream_app(settings, store: Store, **changes: Any) -> testing.TestClient:
    return testing.TestClient(create_app(dataclasses.replace(settings, **changes), store=store))


def test_events_are_state_and_progress_in_seq_order_after_a_given_seq(client, running, store) -> None:
    held, key = running()
    report(store, held, 1, 2, 3)
    every = client.simulate_get(f"/v1/jobs/{held.job_id}/events", headers=auth(key)).json["events"]
    assert [(e["seq"], e["type"]) for e in every] == [
        (1, "state"), (2, "state"), (3, "progress"), (4, "progress"), (5, "progress")]
    assert every[1] | {"at": None} == {"seq": 2, "type": "state", "at": None, "from": "queued", "to": "running",
                                       "reason": "claimed"}
    assert every[4] | {"at": None} == {"seq": 5, "type": "progress", "at": None, "attempt": 1, "node": "3",
                                       "value": 3, "max": 10}
    assert every[4]["at"].endswith("Z")
    later = client.simulate_get(f"/v1/jobs/{held.job_id}/events", params={"after": "2"}, headers=auth(key))
    assert [e["seq"] for e in later.json["events"]] == [3, 4, 5]
    assert client.simulate_get(f"/v1/jobs/{held.job_id}/events?after=5", headers=auth(key)).json == {"events": []}


@pytest.mark.parametrize("after", ["-1", "x", "1.5", "1000000000000000000", "", "١"])
def test_a_bad_after_is_400_and_a_bad_last_event_id_too(client, running, after) -> None:
    held, key = running()
    for path in ("events", "events/stream"):
        resp = client.simulate_get(f"/v1/jobs/{held.job_id}/{path}", query_string=f"after={after}", headers=auth(key))
        assert (resp.status_code, resp.json["type"], resp.json["field"]) == (
            400, "urn:reckon:problem:invalid-parameter", "after"), path
    resp = client.simulate_get(f"/v1/jobs/{held.job_id}/events/stream", query_string=f"after={after}",
                               headers=auth(key) | {"Last-Event-ID": "1"})
    assert (resp.status_code, resp.json["field"]) == (400, "after")  # checked even when the header wins
    if after:
        resp = client.simulate_get(f"/v1/jobs/{held.job_id}/events/stream",
                                   headers=auth(key) | {"Last-Event-ID": after.encode().decode("latin-1")})
        assert (resp.status_code, resp.json["field"]) == (400, "Last-Event-ID")


def test_another_tenants_job_is_404(client, running, tenant) -> None:
    held, _ = running()
    other = tenant("globex")
    for path in (f"/v1/jobs/{held.job_id}/events", f"/v1/jobs/{held.job_id}/events/stream",
                 "/v1/jobs/globex.0123456789abcdef0123/events/stream"):
        resp = client.simulate_get(path, headers=auth(other))
        assert (resp.status_code, resp.json["type"]) == (404, "urn:reckon:problem:job-not-found"), path


def test_a_stream_sends_every_event_once_in_order_and_ends_when_the_job_ends(settings, store, running) -> None:
    held, key = running()
    report(store, held, 1)

    def work() -> None:
        time.sleep(0.3)
        report(store, held, 2, 3)
        time.sleep(0.3)
        report(store, held, 4)
        store.finish(held, "failed", error_class="invalid_input")

    worker = threading.Thread(target=work)
    worker.start()
    started = time.monotonic()
    resp = stream_app(settings, store, sse_max_seconds=20).simulate_get(
        f"/v1/jobs/{held.job_id}/events/stream", headers=auth(key))
    elapsed = time.monotonic() - started
    worker.join()
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    assert resp.text.startswith("retry: 1000\n\n")
    sent = messages(resp.text)
    assert [(seq, kind) for seq, kind, _ in sent] == [
        (1, "state"), (2, "state"), (3, "progress"), (4, "progress"), (5, "progress"), (6, "progress"),
        (7, "state")]
    assert [data["seq"] for _, _, data in sent] == [1, 2, 3, 4, 5, 6, 7]
    assert sent[-1][2]["to"] == "failed"
    assert 0.6 <= elapsed < 5


def test_last_event_id_resumes_after_it_and_a_finished_job_with_nothing_left_is_204(settings, store, running) -> None:
    held, key = running()
    report(store, held, 1, 2)
    store.finish(held, "failed", error_class="invalid_input")  # seqs 1..5
    app = stream_app(settings, store)
    path = f"/v1/jobs/{held.job_id}/events/stream"
    resumed = app.simulate_get(path, headers=auth(key) | {"Last-Event-ID": "2"})
    assert [seq for seq, _, _ in messages(resumed.text)] == [3, 4, 5]
    assert [seq for seq, _, _ in messages(app.simulate_get(path, params={"after": "4"}, headers=auth(key)).text)] == [5]
    both = app.simulate_get(path, params={"after": "1"}, headers=auth(key) | {"Last-Event-ID": "3"})
    assert [seq for seq, _, _ in messages(both.text)] == [4, 5]  # the header wins: a reconnect keeps the URL
    done = app.simulate_get(path, headers=auth(key) | {"Last-Event-ID": "5"})
    assert (done.status_code, done.text) == (204, "")


def test_a_stream_of_a_job_that_keeps_running_closes_after_its_max_seconds(settings, store, running) -> None:
    held, key = running()
    started = time.monotonic()
    resp = stream_app(settings, store, sse_max_seconds=0.3).simulate_get(
        f"/v1/jobs/{held.job_id}/events/stream", headers=auth(key))
    elapsed = time.monotonic() - started
    assert resp.status_code == 200
    assert [seq for seq, _, _ in messages(resp.text)] == [1, 2]
    assert 0.3 <= elapsed < 1.5
    assert store.job(held.job_id)["state"] == "running"


def test_a_process_serves_at_most_its_stream_slots(settings, store, running, monkeypatch) -> None:
    held, key = running()
    app = stream_app(settings, store, sse_max_seconds=30.0, sse_max_streams=1)
    path = f"/v1/jobs/{held.job_id}/events/stream"
    opened, open_slot = threading.Event(), sse.StreamSlots.open

    def open_and_tell(slots: sse.StreamSlots, chunks: Any) -> sse.Body | None:
        body = open_slot(slots, chunks)
        if body is not None:
            opened.set()
        return body

    monkeypatch.setattr(sse.StreamSlots, "open", open_and_tell)
    first: list[testing.Result] = []
    holder = threading.Thread(target=lambda: first.append(app.simulate_get(path, headers=auth(key))))
    holder.start()
    assert opened.wait(10)  # the holder's stream has the only slot, and keeps it while the job runs
    refused = app.simulate_get(path, headers=auth(key))
    store.finish(held, "failed", error_class="invalid_input")  # the holder's stream ends at its next poll
    holder.join(10)
    assert (refused.status_code, refused.json["type"], refused.headers["retry-after"]) == (
        503, "urn:reckon:problem:too-many-streams", "1")
    assert first[0].status_code == 200
    assert app.simulate_get(path, headers=auth(key)).status_code == 200  # the slot was given back


def test_quiet_streams_send_a_ping_and_end_on_time() -> None:
    now = [0.0]
    reads: list[int] = []

    def read(after: int) -> tuple[str, list[dict[str, Any]]]:
        reads.append(after)
        return "running", []

    chunks = list(sse.stream(read, 7, max_seconds=12, poll_seconds=0.5, ping_seconds=5,
                             clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)))
    assert chunks == [b"retry: 1000\n\n", b": ping\n\n", b": ping\n\n"]
    assert reads == [7] * 25  # at 0, 0.5, ..., 12 s


def test_a_stream_slot_is_given_back_even_if_the_body_was_never_iterated() -> None:
    slots = sse.StreamSlots(1)
    body = slots.open(iter([b"x"]))
    assert body is not None and slots.open(iter([])) is None
    body.close()
    body.close()  # once
    again = slots.open(iter([]))
    assert again is not None and slots.open(iter([])) is None


def test_under_gunicorn_events_arrive_while_the_stream_is_open(web, tenant, store) -> None:
    key = tenant("acme")
    status, _, body = web.request("POST", "/v1/jobs", orjson.dumps(
        {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {}}}, "outputs": 1}),
        auth(key) | {"Idempotency-Key": "one", "Content-Type": "application/json"})
    job_id = orjson.loads(body)["id"]
    held = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-1", servers={"s1": 4})
    assert status == 202 and held is not None
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    try:
        conn.request("GET", f"/v1/jobs/{job_id}/events/stream", headers=auth(key))
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Content-Type")) == (200, "text/event-stream")
        head = b""
        while head.count(b"\n\n") < 3:  # retry, then events 1 and 2, before anything else happens
            head += resp.read1(4096)
        report(store, held, 1)
        store.finish(held, "failed", error_class="invalid_input")
        text = (head + resp.read()).decode()
    finally:
        conn.close()
    assert [(seq, kind) for seq, kind, _ in messages(text)] == [(1, "state"), (2, "state"), (3, "progress"),
                                                                 (4, "state")]
