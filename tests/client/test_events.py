"""``Client.events`` over the real stack through a proxy that cuts the first event stream in the
middle of an event: the client reopens it from the last id it was given and misses nothing; and from
the streams process, when the client is given its URL; and a key revoked while its stream is open raises
``Unauthorized``."""

from __future__ import annotations

import threading
from typing import Any

import orjson
from reckon.client import Client, Unauthorized

from pipeline.state.tenants import create_key, create_tenant, revoke_key
from tests.api.conftest import Streams
from tests.client.conftest import job_body, whole_stack


def test_events_resume_after_a_dropped_stream_without_duplicates_or_gaps(stack, proxy, redis_client) -> None:
    api_key = whole_stack(stack, redis_client, delay=2.0)  # the job runs 2 s: the stream is reopened while it runs
    front = proxy(stack.web_port, cut_stream_after=b"id: 2\n")  # event 2's id sent, its data not
    client = Client(front.url, api_key, deadline=30)

    job = client.submit("watched-1", job_body())
    seen = list(client.events(job["id"]))

    streams = front.requests(f"GET /v1/jobs/{job['id']}/events/stream".encode())
    assert bytes(streams[0].response).endswith(b"id: 2\n") and streams[0].header("Last-Event-ID") == "0"
    assert (streams[1].header("Last-Event-ID"), streams[1].request.split(b" ")[1].split(b"?")[1]) == ("1", b"after=1")
    assert all(stream.status == 200 for stream in streams)
    seqs = [event["seq"] for event in seen]
    assert seqs[:2] == [1, 2] and seqs == sorted(set(seqs))  # the cut event once, whole; nothing twice
    states = [event for event in seen if event["type"] == "state"]
    assert [(e["from"], e["to"]) for e in states] == [(None, "queued"), ("queued", "running"), ("running", "completed")]
    status, _, raw = stack.api("GET", f"/v1/jobs/{job['id']}/events?after=0", Authorization=f"Bearer {api_key}")
    assert status == 200 and states == orjson.loads(raw)["events"]  # every event the API keeps, as it keeps it
    assert seen[-1] == states[-1]  # the iteration ended with the terminal event


def test_events_come_from_the_streams_process_when_it_is_named(stack_with, redis_client, tmp_path) -> None:
    stack = stack_with(RECKON_SSE_MAX_STREAMS="0")  # the web process refuses every stream: 503 too-many-streams
    api_key = whole_stack(stack, redis_client, delay=1.0)
    (tmp_path / "streams").mkdir()
    streams = Streams(tmp_path / "streams")
    streams.start()
    try:
        client = Client(f"http://127.0.0.1:{stack.web_port}", api_key, streams_url=streams.url, deadline=30)
        job = client.submit("watched-2", job_body())
        seen = list(client.events(job["id"]))
    finally:
        streams.stop()
    seqs = [event["seq"] for event in seen]
    assert seqs == sorted(set(seqs)) and seqs[0] == 1
    states = [(e["from"], e["to"]) for e in seen if e["type"] == "state"]
    assert states == [(None, "queued"), ("queued", "running"), ("running", "completed")]


def test_a_key_revoked_while_its_stream_is_open_raises_unauthorized(web, store, redis_client, tmp_path) -> None:
    create_tenant(redis_client, "acme", 1_000)
    api_key = create_key(redis_client, "acme")
    (tmp_path / "streams").mkdir()
    streams = Streams(tmp_path / "streams", RECKON_AUTH_CACHE_SECONDS="1")
    streams.start()
    try:
        client = Client(web.url, api_key, streams_url=streams.url, deadline=10)
        job = client.submit("watched-3", job_body())
        assert store.claim(job["id"], worker="w1", lease_ms=30_000, operation_id="op-1", servers={"s1": 4})
        events = client.events(job["id"])
        assert [next(events)["seq"], next(events)["seq"]] == [1, 2]  # queued, running: the stream is open
        revoke_key(redis_client, api_key)
        raised: list[Any] = []
        reader = threading.Thread(target=lambda: raised.append(_raised(lambda: next(events))), daemon=True)
        reader.start()
        reader.join(15)  # the refusal shows within RECKON_AUTH_CACHE_SECONDS (1 s); the bound is generous
    finally:
        streams.stop()
    assert len(raised) == 1 and isinstance(raised[0], Unauthorized), raised
    assert (raised[0].status, raised[0].detail) == (401, "the API key of this stream was revoked")


def _raised(call: Any) -> Any:
    """What ``call()`` raised, or what it returned."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 (the test asserts which)
        return exc
