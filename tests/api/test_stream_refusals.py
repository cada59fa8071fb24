"""An open event stream whose key is revoked, or whose tenant is disabled, ends: a final ``end`` event (the
401 problem, why, no key material), then the connection closes, within RECKON_AUTH_CACHE_SECONDS; and no
event made after the process found the refusal goes down it. The streams process (job and tenant
streams) and the web process (job streams), each run as deployed, read over sockets."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from pipeline.state.store import Store
from pipeline.state.tenants import create_key, revoke_key, set_disabled
from tests.conftest import wait_until

from .conftest import Streams, Web, auth
from .test_streams import Reader, report, running  # noqa: F401 (a fixture, used by name)

#: How long a process trusts a key it looked up, in these tests (s): RECKON_AUTH_CACHE_SECONDS.
TRUST = 1.0
#: A stream must end within TRUST plus this (s): a shared machine's scheduling, the web stream's poll.
MARGIN = 5.0

Message = tuple[str, str, Any]


def end_of(why: str) -> Message:
    """The final event of a stream refused for ``why``, as Reader gives it (no id)."""
    detail = {"revoked key": "the API key of this stream was revoked",
              "disabled tenant": "the tenant of this stream is disabled"}[why]
    return "", "end", {"type": "urn:reckon:problem:unauthorized", "title": "Authentication refused",
                       "status": 401, "detail": detail}


class Follower:
    """Reads one open stream in a thread of its own until it closes; ``within(s)`` waits for that."""

    def __init__(self, reader: Reader) -> None:
        self.reader, self.messages = reader, []  # type: list[Message]
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while (message := self.reader.next()) is not None:
            self.messages.append(message)

    def within(self, seconds: float) -> list[Message]:
        """Every message it sent; fails unless the stream closed within ``seconds``."""
        self.thread.join(seconds)
        assert not self.thread.is_alive(), f"still open after {seconds} s, having sent {self.messages}"
        return self.messages


class Opened:
    """The streams a test opens (``opened(server, path, key)``) and follows (``opened.follow(reader)``): when
    the test ends, each connection is shut down (a follower's read then ends), followers joined, all closed."""

    def __init__(self) -> None:
        self.readers: list[Reader] = []
        self.followers: list[Follower] = []

    def __call__(self, server: Web, path: str, api_key: str) -> Reader:
        self.readers.append(Reader(server, path, auth(api_key)))
        return self.readers[-1]

    def follow(self, reader: Reader) -> Follower:
        self.followers.append(Follower(reader))
        return self.followers[-1]

    def close(self) -> None:
        for reader in self.readers:
            if reader.conn.sock is not None:
                reader.conn.sock.shutdown(socket.SHUT_RDWR)
        for follower in self.followers:
            follower.thread.join(10)
        for reader in self.readers:
            reader.close()


@pytest.fixture
def opened() -> Iterator[Opened]:
    streams = Opened()
    try:
        yield streams
    finally:
        streams.close()


def refuse(store: Store, api_key: str, why: str) -> None:
    if why == "revoked key":
        revoke_key(store.redis, api_key)
    else:
        set_disabled(store.redis, "acme", True)


@pytest.fixture
def streams(redis_client, tmp_path: Path) -> Iterator[Streams]:
    server = Streams(tmp_path, RECKON_STREAMS_PING_SECONDS="1", RECKON_AUTH_CACHE_SECONDS=str(TRUST))
    try:
        server.start()
        yield server
    finally:
        server.stop(graceful=False)


@pytest.mark.parametrize("why", ["revoked key", "disabled tenant"])
def test_the_streams_of_a_refused_key_end_within_the_trust_time_and_others_go_on(
        streams: Streams, running, opened, store: Store, tenant, why: str) -> None:
    held, k1 = running("acme")
    k2 = create_key(store.redis, "acme")
    globex = tenant("globex")
    job = opened(streams, f"/v1/jobs/{held.job_id}/events/stream", k1)
    assert [i for i, _, _ in job.take(2)] == ["1", "2"]  # queued, running: the stream is open
    mine, same_tenant, other = (opened(streams, "/v1/events/stream", key) for key in (k1, k2, globex))
    report(store, held, 1)
    assert [i for i, _, _ in job.take(1)] == ["3"]
    for reader in (mine, same_tenant):
        assert [(d["job"], d["seq"]) for _, _, d in reader.take(1)] == [(held.job_id, 3)]
    followers = [opened.follow(job), opened.follow(mine)]
    refused_at = time.monotonic()
    refuse(store, k1, why)
    sent = [follower.within(TRUST + MARGIN) for follower in followers]
    assert time.monotonic() - refused_at < TRUST + MARGIN
    assert sent == [[end_of(why)], [end_of(why)]]  # the final event, then closed
    theirs, _ = running("globex", globex)  # the other tenant's stream goes on
    assert [(d["job"], d["seq"]) for _, _, d in other.take(1)] == [(theirs.job_id, 1)]
    if why == "revoked key":  # the tenant's other key goes on; a disabled tenant's ends too
        report(store, held, 2)
        assert [(d["job"], d["seq"]) for _, _, d in same_tenant.take(1)] == [(held.job_id, 4)]
    else:
        assert opened.follow(same_tenant).within(TRUST + MARGIN) == [end_of(why)]


def test_no_event_made_after_the_streams_process_found_a_revocation_goes_down_the_stream(
        streams: Streams, running, opened, store: Store) -> None:
    held, k1 = running("acme")
    k2 = create_key(store.redis, "acme")
    job = opened(streams, f"/v1/jobs/{held.job_id}/events/stream", k1)
    assert [i for i, _, _ in job.take(2)] == ["1", "2"]
    mine, same_tenant = (opened(streams, "/v1/events/stream", key) for key in (k1, k2))
    revoke_key(store.redis, k1)
    # The process has found it once a new request with the key is refused (400 while it is trusted: a bad cursor).
    wait_until(lambda: streams.request("GET", "/v1/events/stream", headers={**auth(k1), "Last-Event-ID": "x"})[0]
               == 401, timeout=TRUST + MARGIN)
    later, _ = running("acme", k2)  # another key's job, and events of the open stream's job, all after it
    report(store, held, 1)
    store.finish(held, "failed", error_class="invalid_input")
    assert [(d["job"], d["seq"]) for _, _, d in same_tenant.take(4)] == [
        (later.job_id, 1), (later.job_id, 2), (held.job_id, 3), (held.job_id, 4)]
    assert opened.follow(job).within(MARGIN) == [end_of("revoked key")]
    assert opened.follow(mine).within(MARGIN) == [end_of("revoked key")]


@pytest.fixture
def web(redis_client, tmp_path: Path) -> Iterator[Web]:
    """One worker: a request refused by it shows what the stream's worker found."""
    server = Web(tmp_path)
    server.env |= {"RECKON_WEB_WORKERS": "1", "RECKON_AUTH_CACHE_SECONDS": str(TRUST)}
    try:
        server.start()
        yield server
    finally:
        server.stop(graceful=False)


def web_job(web: Web, store: Store, api_key: str, intent: str) -> Any:
    status, _, body = web.request("POST", "/v1/jobs", orjson.dumps(
        {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {}}}, "outputs": 1}),
        auth(api_key) | {"Idempotency-Key": intent, "Content-Type": "application/json"})
    assert status == 202, body
    held = store.claim(orjson.loads(body)["id"], worker="w1", lease_ms=30_000, operation_id="op-1",
                       servers={"s1": 4})
    assert held is not None
    return held


@pytest.mark.parametrize("why", ["revoked key", "disabled tenant"])
def test_a_web_stream_of_a_refused_key_ends_within_the_trust_time(web: Web, opened, tenant, store: Store, why: str) -> None:
    key = tenant("acme")
    held = web_job(web, store, key, "one")
    stream = opened(web, f"/v1/jobs/{held.job_id}/events/stream", key)
    assert [i for i, _, _ in stream.take(2)] == ["1", "2"]
    follower = opened.follow(stream)
    refused_at = time.monotonic()
    refuse(store, key, why)
    assert follower.within(TRUST + MARGIN) == [end_of(why)]  # well before its 15 s bound
    assert time.monotonic() - refused_at < TRUST + MARGIN


def test_no_event_made_after_the_web_process_found_a_revocation_goes_down_its_stream(
        web: Web, opened, tenant, store: Store) -> None:
    key = tenant("acme")
    held = web_job(web, store, key, "one")
    stream = opened(web, f"/v1/jobs/{held.job_id}/events/stream", key)
    assert [i for i, _, _ in stream.take(2)] == ["1", "2"]
    revoke_key(store.redis, key)
    wait_until(lambda: web.request("GET", "/v1/usage", headers=auth(key))[0] == 401, timeout=TRUST + MARGIN)
    report(store, held, 1)
    store.finish(held, "failed", error_class="invalid_input")
    assert opened.follow(stream).within(MARGIN) == [end_of("revoked key")]
