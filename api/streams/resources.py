"""The two event streams of the streams process: a job's, and every job of a tenant's.

A job's stream sends the job's events (state and progress) with their ``seq`` as ids, read from the
job's own lists when its room is woken, exactly as ``GET /v1/jobs/{id}/events/stream`` of the web
process does. A tenant's stream sends the entries of its shard's stream of changes that are its
jobs', with the entry id as the event id. Each holds its key's grant (``auth``): once the key is
refused, it sends a final ``end`` event and no other, and ends. See docs/api.md "Event streams".
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, AsyncIterator, Callable

import falcon
import orjson
import redis
from falcon.asgi import Request, Response, SSEvent

from api.problems import Problem
from api.resources import resume_after
from api.sse import END_EVENT, RETRY_MS, end_data, public
from api.streams.auth import Grant, Grants
from api.streams.hub import RETRY_SECONDS, Change, EntryId, Hub, Room, Trimmed, entry_id, entry_text
from pipeline.state.ids import tenant_of
from pipeline.state.keys import ShardKeys, shard_of
from pipeline.state.progress import TERMINAL

log = logging.getLogger(__name__)

#: A tenant stream's cursor: an entry id of its shard's stream of changes, ``<ms>-<seq>``.
ENTRY_ID_RE = re.compile(r"[0-9]{1,15}-[0-9]{1,18}")


class Slots:
    """At most ``limit`` open streams in this process; more are refused with 503."""

    def __init__(self, limit: int) -> None:
        self.limit, self.open = limit, 0

    def take(self) -> Callable[[], None]:
        """A slot, as the function that gives it back (once)."""
        if self.open >= self.limit:
            raise Problem(503, "too-many-streams", "Too many event streams",
                          "every event stream of this server is taken; retry, or poll the events with ?after=",
                          headers={"Retry-After": "1"})
        self.open += 1
        given = False

        def give_back() -> None:
            nonlocal given
            if not given:
                given, self.open = True, self.open - 1

        return give_back


def _open(resp: Response, events: AsyncIterator[SSEvent | None]) -> None:
    resp.cache_control = ["no-store"]
    resp.set_header("X-Accel-Buffering", "no")  # proxies that buffer (nginx) pass each event on at once
    resp.sse = events


class JobStream:
    """``GET /v1/jobs/{job_id}/events/stream``: from ``Last-Event-ID`` (else ``?after=``), until the job
    is terminal or the key refused; 204 when it is terminal and nothing is left to send; 404 for a job of
    another tenant or none."""

    def __init__(self, hub: Hub, slots: Slots, ping_seconds: float, grants: Grants) -> None:
        self.hub, self.slots, self.ping_seconds, self.grants = hub, slots, ping_seconds, grants

    async def on_get(self, req: Request, resp: Response, job_id: str) -> None:
        try:
            owner = tenant_of(job_id)
        except ValueError:
            owner = None
        if owner != req.context.tenant:
            raise Problem(404, "job-not-found", "Job not found")
        after = resume_after(req)
        give_back = self.slots.take()
        try:
            room = await self.hub.join(self.hub.jobs, job_id, shard_of(owner))
        except BaseException:
            give_back()
            raise
        try:
            seen = room.version
            state, events = await self.hub.snapshot(room, seen, job_id)
            if state is None:
                raise Problem(404, "job-not-found", "Job not found")
        except BaseException:
            self.hub.leave(self.hub.jobs, job_id)
            give_back()
            raise
        if state in TERMINAL and not any(e["seq"] > after for e in events):
            self.hub.leave(self.hub.jobs, job_id)
            give_back()
            resp.status = falcon.HTTP_204  # an EventSource does not reconnect after a 204
            return
        grant = self.grants.hold(req.context.key_hash, owner, room.wake)
        _open(resp, self._events(room, seen, job_id, after, grant, give_back))

    async def _events(self, room: Room, seen: int, job_id: str, after: int, grant: Grant,
                      give_back: Callable[[], None]) -> AsyncIterator[SSEvent | None]:
        try:
            yield SSEvent(retry=RETRY_MS)
            while not grant.refused:
                try:
                    state, events = await self.hub.snapshot(room, seen, job_id)
                except redis.RedisError as exc:
                    yield await _unavailable(f"job {job_id}", exc)
                    room.wake()  # the next read is a new one, for every stream of the job
                    seen = room.version
                    continue
                for event in events:
                    if grant.refused:  # refused while the last one was going out: nothing more
                        break
                    if event["seq"] > after:
                        yield SSEvent(data=orjson.dumps(public(event)), event=event["type"], event_id=str(event["seq"]))
                        after = event["seq"]
                if grant.refused or state is None or state in TERMINAL:
                    break
                while not await room.wait(seen, self.ping_seconds):
                    yield None  # a comment line: proxies keep the connection, and a client gone is found
                seen = room.version
            if grant.refused:
                yield _end(grant.refused)
        finally:
            self.grants.release(grant, room.wake)
            self.hub.leave(self.hub.jobs, job_id)
            give_back()


def tenant_cursor(req: Request) -> EntryId | None:
    """Where a tenant stream starts: after ``Last-Event-ID``, else after ``?after=``, else (None) at the newest
    entry; each an entry id ``<ms>-<seq>``, else 400."""
    for name, raw in (("Last-Event-ID", req.get_header("Last-Event-ID")), ("after", req.get_param("after"))):
        if raw is None:
            continue
        if not ENTRY_ID_RE.fullmatch(raw):
            raise Problem(400, "invalid-parameter", "Invalid event id", f"{name} must be an event id <ms>-<seq>",
                          field=name)
        return entry_id(raw)
    return None


class TenantStream:
    """``GET /v1/events/stream``: the events of every job of the tenant, in the order its shard added them,
    each with its entry id, until the key is refused; a cursor older than what the shard keeps gets a
    ``resync`` event first."""

    def __init__(self, hub: Hub, slots: Slots, ping_seconds: float, grants: Grants) -> None:
        self.hub, self.slots, self.ping_seconds, self.grants = hub, slots, ping_seconds, grants

    async def on_get(self, req: Request, resp: Response) -> None:
        tenant = req.context.tenant
        cursor = tenant_cursor(req)
        give_back = self.slots.take()
        shard = shard_of(tenant)
        try:
            room = await self.hub.join(self.hub.tenants, tenant, shard)
        except BaseException:
            give_back()
            raise
        try:
            if cursor is None:
                cursor = await self.hub.tail(ShardKeys(shard).changes)
        except BaseException:
            self.hub.leave(self.hub.tenants, tenant)
            give_back()
            raise
        grant = self.grants.hold(req.context.key_hash, tenant, room.wake)
        _open(resp, self._events(room, tenant, shard, cursor, grant, give_back))

    async def _events(self, room: Room, tenant: str, shard: int, cursor: EntryId, grant: Grant,
                      give_back: Callable[[], None]) -> AsyncIterator[SSEvent | None]:
        try:
            yield SSEvent(retry=RETRY_MS)
            while not grant.refused:
                seen = room.version
                try:
                    changes = await self.hub.changes_after(shard, cursor)
                except redis.RedisError as exc:
                    yield await _unavailable(f"tenant {tenant}", exc)
                    continue
                except Trimmed as gone:
                    cursor = gone.tail
                    yield SSEvent(event="resync", event_id=entry_text(cursor), data=orjson.dumps(
                        {"reason": "events after Last-Event-ID are no longer kept: read the jobs again "
                                   "(GET /v1/jobs), this stream goes on from here"}))
                    continue
                for change in changes:
                    if grant.refused:  # refused while the last one was going out: nothing more
                        break
                    cursor = change.id
                    if change.tenant == tenant:
                        yield _tenant_event(change)
                if changes or grant.refused:
                    continue  # more may be there
                while not await room.wait(seen, self.ping_seconds):
                    yield None
            if grant.refused:
                yield _end(grant.refused)
        finally:
            self.grants.release(grant, room.wake)
            self.hub.leave(self.hub.tenants, tenant)
            give_back()


async def _unavailable(name: str, exc: Exception) -> None:
    """While Redis does not answer, an open stream stays open and reads again from its cursor every
    ``RETRY_SECONDS``, a comment line each time: ending it would make a browser's ``EventSource``
    reconnect into a 503, which it takes as final."""
    log.debug("event stream of %s waits: Redis unavailable (%s)", name, exc)
    await asyncio.sleep(RETRY_SECONDS)


def _end(why: str) -> SSEvent:
    """The final event of a stream whose key was refused: no id, so a client's resume point stays the last
    event it got; its reconnect is then 401, which an ``EventSource`` takes as final."""
    return SSEvent(event=END_EVENT, data=end_data(why))


def _tenant_event(change: Change) -> SSEvent:
    event: dict[str, Any] = orjson.loads(change.raw)
    event.setdefault("type", "state")  # a state event's list holds it without its type
    return SSEvent(data=orjson.dumps({"job": change.job, **public(event)}), event=event["type"],
                   event_id=entry_text(change.id))
