"""The streams process (api/streams/) as deployed: gunicorn with uvicorn workers on a free loopback port,
its state changed by the scripts in this process. Each stream is read as a client reads it, over a socket,
and dropped mid-way to resume with Last-Event-ID or ?after=."""

from __future__ import annotations

import asyncio
import http.client
import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.streams.hub import Change
from pipeline.claims import Claim
from pipeline.state import progress
from pipeline.state.keys import JobKeys, ShardKeys
from pipeline.state.store import Store

from .conftest import Streams, Web, auth


class Reader:
    """One open event stream: its messages as (id, event, data), read as they come."""

    def __init__(self, streams: Web, path: str, headers: dict[str, str]) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", streams.port, timeout=10)
        self.conn.request("GET", path, headers=headers)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, (self.resp.status, self.resp.read())
        assert self.resp.getheader("Content-Type") == "text/event-stream"

    def next(self) -> tuple[str, str, dict[str, Any]] | None:
        """The next message with an id or an event name (comments and the retry field skipped; a message
        without an id, as the final ``end``, has the id ""); None when the stream ends."""
        fields: dict[str, str] = {}
        while True:
            line = self.resp.readline().decode()
            if not line:
                return None
            line = line.rstrip("\n")
            if line == "":
                if "id" in fields or "event" in fields:
                    return fields.get("id", ""), fields.get("event", ""), orjson.loads(fields.get("data", "null"))
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value

    def take(self, n: int) -> list[tuple[str, str, dict[str, Any]]]:
        found = [self.next() for _ in range(n)]
        assert None not in found, found
        return found  # type: ignore[return-value]

    def rest(self) -> list[tuple[str, str, dict[str, Any]]]:
        found = []
        while (message := self.next()) is not None:
            found.append(message)
        return found

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


@pytest.fixture
def running(submit, tenant, store: Store):
    """Factory: a job of ``name`` claimed by a worker (events 1 queued, 2 running), and the tenant's key."""

    intents = itertools.count()

    def make(name: str = "acme", key: str | None = None) -> tuple[Claim, str]:
        key = key or tenant(name)
        job_id = submit(key, key=f"intent-{next(intents)}").json["id"]
        held = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-1", servers={"s1": 4})
        assert held is not None
        return held, key

    return make


def report(store: Store, held: Claim, *values: int) -> None:
    for value in values:
        assert progress.record(store.scripts, held.job_id, held.attempt, held.operation_id, "3", value, 10)


def test_without_a_key_it_is_401_and_another_tenants_job_is_404(streams: Streams, running, tenant) -> None:
    held, _ = running()
    other = tenant("other")
    for path in (f"/v1/jobs/{held.job_id}/events/stream", "/v1/events/stream"):
        status, headers, body = streams.request("GET", path)
        assert (status, headers["content-type"]) == (401, "application/problem+json")
        assert orjson.loads(body)["type"] == "urn:reckon:problem:unauthorized"
        assert streams.request("GET", path, headers=auth("not-a-key"))[0] == 401
    status, headers, body = streams.request("GET", f"/v1/jobs/{held.job_id}/events/stream", headers=auth(other))
    assert (status, orjson.loads(body)["type"]) == (404, "urn:reckon:problem:job-not-found")
    status, _, body = streams.request("GET", "/v1/events/stream", headers={**auth(other), "Last-Event-ID": "7"})
    assert (status, orjson.loads(body)["type"]) == (400, "urn:reckon:problem:invalid-parameter")


@pytest.mark.parametrize("resume", ["Last-Event-ID", "after"])
def test_a_job_stream_resumes_exactly_after_a_dropped_connection(streams: Streams, running, store, resume) -> None:
    held, key = running()
    path = f"/v1/jobs/{held.job_id}/events/stream"
    first = Reader(streams, path, auth(key))
    report(store, held, 1)
    seen = first.take(3)  # queued, running, the first point
    first.close()  # dropped: what comes next happens while no stream is open
    report(store, held, 2, 3)
    last = seen[-1][0]
    headers, query = ({**auth(key), "Last-Event-ID": last}, "") if resume == "Last-Event-ID" \
        else (auth(key), f"?after={last}")
    second = Reader(streams, path + query, headers)
    seen += second.take(2)
    report(store, held, 4)
    store.finish(held, "failed", error_class="invalid_input")
    seen += second.rest()  # the stream ends with the job
    second.close()
    assert [int(i) for i, _, _ in seen] == list(range(1, 8))  # no gap, no duplicate
    assert [e for _, e, _ in seen] == ["state", "state"] + ["progress"] * 4 + ["state"]
    assert seen[-1][2]["to"] == "failed"
    status, _, _ = streams.request("GET", path, headers={**auth(key), "Last-Event-ID": "7"})
    assert status == 204  # finished, nothing left to send


@pytest.mark.parametrize("resume", ["Last-Event-ID", "after"])
def test_the_tenant_stream_resumes_exactly_and_never_shows_another_tenants_job(
        streams: Streams, running, store, tenant, resume) -> None:
    acme = tenant("acme")
    first = Reader(streams, "/v1/events/stream", auth(acme))
    one, _ = running("acme", acme)
    theirs, _ = running("other")
    report(store, one, 1)
    report(store, theirs, 1, 2)
    seen = first.take(3)  # one's queued, running, first point
    first.close()
    two, _ = running("acme", acme)
    report(store, theirs, 3)
    report(store, one, 2)
    last = seen[-1][0]
    headers, query = ({**auth(acme), "Last-Event-ID": last}, "") if resume == "Last-Event-ID" \
        else (auth(acme), f"?after={last}")
    second = Reader(streams, "/v1/events/stream" + query, headers)
    store.finish(two, "failed", error_class="invalid_input")
    seen += second.take(4)  # two's queued and running, one's second point, two's end
    second.close()
    assert [(data["job"], data["seq"]) for _, _, data in seen] == [
        (one.job_id, 1), (one.job_id, 2), (one.job_id, 3), (two.job_id, 1), (two.job_id, 2), (one.job_id, 4),
        (two.job_id, 3)]
    assert [data.get("to") for _, _, data in seen] == ["queued", "running", None, "queued", "running", None, "failed"]
    ids = [i for i, _, _ in seen]
    assert sorted(ids, key=lambda i: tuple(map(int, i.split("-")))) == ids and len(set(ids)) == len(ids)


def test_a_tenant_cursor_older_than_what_is_kept_gets_a_resync_first(
        running, store, redis_client, tmp_path: Path) -> None:
    """Entries trimmed before the process started (it holds in memory what it read since)."""
    held, key = running()
    report(store, held, 1)
    changes = ShardKeys(0).changes
    oldest = redis_client.xrange(changes, count=1)[0][0]
    redis_client.xtrim(changes, maxlen=1, approximate=False)  # what MAXLEN ~ does past 100,000 entries
    streams = Streams(tmp_path)
    try:
        streams.start()
        reader = Reader(streams, "/v1/events/stream", {**auth(key), "Last-Event-ID": oldest})
        resync = reader.next()
        report(store, held, 2)
        after = reader.next()
        reader.close()
    finally:
        streams.stop(graceful=False)
    assert resync is not None and resync[1] == "resync"
    assert resync[0] == redis_client.xrevrange(changes, count=2)[1][0]  # the newest entry when it connected
    assert after is not None and (after[2]["job"], after[2]["seq"]) == (held.job_id, 4)


def test_one_process_serves_250_streams_of_one_job_and_each_gets_its_completion(
        streams: Streams, running, store) -> None:
    """The web process serves 2 at once; the streams process, one coroutine each."""
    held, key = running()
    count = 250

    async def follow(opened: list[int]) -> list[str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", streams.port)
        writer.write(f"GET /v1/jobs/{held.job_id}/events/stream HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {key}\r\n\r\n".encode())
        await writer.drain()
        status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 200"), await reader.read(2000)
        ids: list[str] = []
        body = b""
        while "3" not in ids:
            chunk = await asyncio.wait_for(reader.read(65536), 30)
            if not chunk:
                break
            body += chunk
            had = len(ids)
            ids = [line[4:].decode() for line in body.split(b"\n") if line.startswith(b"id: ")]
            if had < 2 <= len(ids):
                opened.append(1)  # its first events came: the stream is open
        writer.close()
        return ids

    async def main() -> list[list[str]]:
        opened: list[int] = []
        tasks = [asyncio.create_task(follow(opened)) for _ in range(count)]
        while len(opened) < count:  # every stream open and past its first events before the job ends
            await asyncio.sleep(0.05)
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()][:1]
        await asyncio.to_thread(store.finish, held, "failed", error_class="invalid_input")
        return await asyncio.gather(*tasks)

    assert asyncio.run(asyncio.wait_for(main(), 60)) == [["1", "2", "3"]] * count


def test_an_entry_holds_the_job_and_its_events_values_and_reads_as_the_jobs_lists_hold_it(
        running, store: Store) -> None:
    """A stream of changes entry is the job id and the event's values, its id the event's moment (no
    tenant, no key names, no `at`: about 60 bytes an entry less); an event whose moment is behind the
    stream's newest id (a given clock) takes the next id and keeps its `at`. Read back, each is the JSON
    its job's list holds, byte for byte, and the tenant the job id names. An entry an earlier version
    wrote (event object, tenant) reads as it was."""
    held, _ = running("acme")
    report(store, held, 1, 2)
    store.finish(held, "failed", error_class="invalid_input", now_ms=1_000)  # a dead letter keeps its lists
    job = JobKeys(held.job_id)
    entries = store.redis.xrange(job.shard.changes)
    assert [sorted(fields) for _, fields in entries] == [["event", "job"]] * 5
    assert [len(orjson.loads(fields["event"])) for _, fields in entries] == [4, 4, 6, 6, 5]  # the last: `at` kept
    changes = [Change.of(entry, fields) for entry, fields in entries]
    listed = {orjson.loads(raw)["seq"]: raw for raw in store.redis.lrange(job.events, 0, -1)
              + store.redis.lrange(job.progress, 0, -1)}
    assert [(c.job, c.tenant, c.raw) for c in changes] == [(held.job_id, "acme", listed[seq]) for seq in range(1, 6)]
    assert [orjson.loads(c.raw)["at"] == c.id[0] for c in changes] == [True] * 4 + [False]
    raw = listed[1]
    earlier = Change.of("1-0", {"job": held.job_id, "tenant": "acme", "event": raw})
    assert (earlier.id, earlier.job, earlier.tenant, earlier.raw) == ((1, 0), held.job_id, "acme", raw)
