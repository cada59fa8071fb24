"""A job's events as Server-Sent Events: a bounded stream that a client resumes by Last-Event-ID.

A stream holds one of gunicorn's threads while it is open, so it ends after ``max_seconds``
(``retry: 1000`` asks the client to come back a second later with the last id it saw), and one
process serves at most ``StreamSlots`` of them at once. Before it sends what it read, a stream asks
whether its key still authenticates its tenant; once refused it sends a final ``end`` event and ends.
See "Progress events" in docs/api.md.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator

import orjson
import redis

from api.problems import PROBLEM_BASE
from pipeline.state.jobs import iso
from pipeline.state.progress import TERMINAL

log = logging.getLogger(__name__)

#: How often a stream reads Redis for new events (one MULTI round trip per read).
DEFAULT_POLL_SECONDS = 0.5
#: A comment line goes out when nothing else was sent for this long, so proxies keep the connection.
DEFAULT_PING_SECONDS = 5.0
#: What the client waits before it reconnects (ms), sent first on every stream.
RETRY_MS = 1000
#: The name of a stream's final event when its key is refused (revoked, or its tenant disabled).
END_EVENT = "end"

#: Reads (state, events after seq): ``pipeline.state.progress.snapshot`` bound to a client and a job.
Read = Callable[[int], tuple[str | None, list[dict[str, Any]]]]


def public(event: dict[str, Any]) -> dict[str, Any]:
    """An event as clients see it: ``at`` as an ISO 8601 time."""
    return {**event, "at": iso(event["at"])}


def frame(event: dict[str, Any]) -> bytes:
    """One SSE message: the seq as its id, the event type as its name, the event as JSON data."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event["seq"], event["type"].encode(), orjson.dumps(public(event)))


def end_data(why: str) -> bytes:
    """The data of a stream's final ``end`` event: the 401 problem its next request gets, saying why."""
    return orjson.dumps({"type": PROBLEM_BASE + "unauthorized", "title": "Authentication refused", "status": 401,
                         "detail": why})


def stream(
    read: Read, after: int, *, max_seconds: float, refusal: Callable[[], str | None] = lambda: None,
    poll_seconds: float = DEFAULT_POLL_SECONDS, ping_seconds: float = DEFAULT_PING_SECONDS,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """Events with seq above ``after`` as they come, until the job is terminal (its last events
    sent first: they come from the same snapshot as its state), gone, or ``max_seconds`` pass; or
    until ``refusal()`` (asked after each read, before its events go out) says why the key is refused."""
    started = quiet_since = clock()
    yield b"retry: %d\n\n" % RETRY_MS
    while True:
        try:
            state, events = read(after)
            why = refusal()
        except redis.RedisError:
            log.warning("event stream stopped: Redis unavailable")
            return
        if why is not None:
            yield b"event: %s\ndata: %s\n\n" % (END_EVENT.encode(), end_data(why))
            return
        for event in events:
            yield frame(event)
            after = event["seq"]
        now = clock()
        if state is None or state in TERMINAL or now - started >= max_seconds:
            return
        if events:
            quiet_since = now
        elif now - quiet_since >= ping_seconds:
            yield b": ping\n\n"
            quiet_since = now
        sleep(min(poll_seconds, max_seconds - (now - started)))


class StreamSlots:
    """At most ``limit`` open streams per process; a slot is given back when the server closes the body."""

    def __init__(self, limit: int) -> None:
        self._free = threading.BoundedSemaphore(limit)

    def open(self, chunks: Iterator[bytes]) -> Body | None:
        """The body holding a slot, or None when every slot is taken."""
        return Body(chunks, self._free.release) if self._free.acquire(blocking=False) else None

    def take(self) -> Callable[[], None] | None:
        """A slot for a request held until its job ends (api/waiting.py), as the function that gives it
        back; None when every slot is taken."""
        return self._free.release if self._free.acquire(blocking=False) else None


class Body:
    """A WSGI response body that runs ``release`` once on ``close()``, whether or not it was iterated
    (a generator's own ``finally`` does not run if it never started)."""

    def __init__(self, chunks: Iterator[bytes], release: Callable[[], None]) -> None:
        self._chunks, self._release = chunks, release
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            self._release()
