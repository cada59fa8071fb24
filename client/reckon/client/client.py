"""``Client``: upload inputs, submit a job once per intent, wait for it, follow its events, download
its outputs.

Every call retries what may succeed unchanged (no answer, ``409 idempotency-request-in-progress``,
429, 502, 503, 504) with the same request, within its deadline; any other refusal raises its type
at once (reckon's docs/client.md).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

from reckon.client import sse
from reckon.client.errors import (
    DeadlineExceeded,
    IntegrityError,
    OutputNotFound,
    ProtocolError,
    ReckonError,
    from_problem,
)
from reckon.client.retry import Backoff
from reckon.client.transport import TRANSPORT_ERRORS, Connect, Deadline, Transport, connect, failure, json_object

T = TypeVar("T")

#: Each try's limit (s): on the connect, and on every read of the answer.
DEFAULT_TIMEOUT = 10.0
#: Each call's limit (s), its tries and the waits between them included.
DEFAULT_DEADLINE = 60.0
#: ``wait`` polls the job after this long (s), then twice as long each time up to ``POLL_CAP``.
POLL_FIRST = 0.25
POLL_CAP = 2.0
#: An event stream silent this long (s) is taken for dead and reopened: twice the longest ping interval
#: (the web process pings every 5 s, the streams process after 15 s of silence) and a margin.
STREAM_SILENCE = 35.0
#: What an event stream waits before it reconnects (s), until the API's ``retry:`` says otherwise.
RECONNECT = 1.0
#: Bytes read at a time from a download; a download into a file object is held in memory up to
#: ``SPOOL`` bytes (then in a temporary file) until its sha256 is checked.
CHUNK = 64 * 1024
SPOOL = 16 * 1024 * 1024

#: The longest ``run`` asks the API to hold one request (s): the API's maximum (docs/api.md "Waiting for the result").
WAIT_ASK = 60

TERMINAL = frozenset({"completed", "failed", "cancelled"})
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,255}")


def idempotency_key(intent: str) -> str:
    """The ``Idempotency-Key`` of an intent: the intent itself when it is a valid key (1 to 255 of
    ``A-Za-z0-9_.:-``, so ``curl -H 'Idempotency-Key: x'`` and ``submit("x", ...)`` are one intent),
    else ``sha256.`` and the hex sha256 of its UTF-8 bytes."""
    if IDEMPOTENCY_KEY.fullmatch(intent):
        return intent
    return "sha256." + hashlib.sha256(intent.encode()).hexdigest()


class _LocalError(Exception):
    """Carries an error of the client's own side of a read (a disk write), which no retry mends."""


class Client:
    """reckon's HTTP API for one tenant's ``api_key``. ``timeout`` bounds each try, ``deadline`` each
    call; ``streams_url`` is where ``events`` reads (the streams process; else ``base_url``'s web
    process, which serves 2 streams at once); ``clock``, ``sleep``, ``backoff`` and ``connect`` are seams
    for tests."""

    def __init__(self, base_url: str, api_key: str, *, streams_url: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, deadline: float = DEFAULT_DEADLINE, backoff: Backoff = Backoff(),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 connect: Connect = connect) -> None:
        if timeout <= 0 or deadline <= 0:
            raise ValueError("timeout and deadline must be positive")
        self.timeout, self.deadline = timeout, deadline
        self._transport = Transport(base_url, connect=connect)
        self._streams = Transport(streams_url, connect=connect) if streams_url else self._transport
        self._auth = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._backoff, self._clock, self._sleep = backoff, clock, sleep

    def __repr__(self) -> str:  # never the key
        return f"Client({self._transport.scheme}://{self._transport.host}:{self._transport.port})"

    def submit(self, intent: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit the job ``body`` (reckon's docs/api.md "The job request") as ``intent``; its 202
        answer, the job. However often it is called, or retried, an intent is one job."""
        data = json.dumps(body, allow_nan=False).encode()  # once: every try sends the same bytes
        headers = {"Idempotency-Key": idempotency_key(intent), "Content-Type": "application/json"}
        return self._call("POST", "/v1/jobs", json_object, body=data, headers=headers)

    def submit_batch(self, intent: str, bodies: list[Mapping[str, Any]]) -> dict[str, Any]:
        """Submit 1 to 1,000 job bodies as one batch (reckon's docs/api.md "Batches"); its 202 answer: ``id``
        and ``items``, each with its ``index`` and its ``job`` (as ``submit`` returns it) or its ``problem``
        (the refusal of that item alone). Item ``i``'s job is the one ``submit(f"{key}.{i}", body)`` names,
        where ``key`` is ``batch_key(intent)``; however often it is retried, a batch answers the same."""
        data = json.dumps({"jobs": list(bodies)}, allow_nan=False).encode()
        headers = {"Idempotency-Key": batch_key(intent), "Content-Type": "application/json"}
        return self._call("POST", "/v1/batches", json_object, body=data, headers=headers)

    def batch(self, batch_id: str, cursor: str | None = None, limit: int = 200) -> dict[str, Any]:
        """A page of the batch: ``counts`` per state (and ``refused``), ``items``, ``next_cursor``."""
        query = urllib.parse.urlencode({"limit": limit, **({"cursor": cursor} if cursor else {})})
        return self._call("GET", f"{_batch_path(batch_id)}?{query}", json_object)

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Cancel the batch's unfinished jobs (or ask the running ones to stop)."""
        return self._call("POST", _batch_path(batch_id, "cancel"), json_object)

    def upload(self, source: str | os.PathLike[str] | bytes, content_type: str | None = None) -> dict[str, Any]:
        """Upload an input (a path, or the bytes) for this tenant's jobs and return the answer: ``name`` (what a
        workflow writes where a loader takes a file: ``LoadImage``'s ``image``, ``LoadAudio``'s ``audio``,
        ``LoadVideo``'s ``file``), ``sha256``, ``bytes``, ``content_type``. ``content_type`` None lets the API
        tell it from the bytes. The same bytes again give the same answer, so a retry is harmless."""
        data = bytes(source) if isinstance(source, (bytes, bytearray)) else Path(source).read_bytes()
        headers = {"Content-Type": content_type or "application/octet-stream"}
        return self._call("POST", "/v1/inputs", json_object, body=data, headers=headers)

    def save_workflow(self, name: str, workflow: Mapping[str, Any],
                      params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Save the next version of this tenant's own workflow ``name`` with its declared ``params`` (reckon's
        docs/api.md "Saved workflows"); the version (``ref`` is ``name@version``). Saving what the latest
        version holds already answers that version, so a retry makes no second one."""
        data = json.dumps({"name": name, "workflow": workflow, "params": params or {}}, allow_nan=False).encode()
        return self._call("POST", "/v1/workflows", json_object, body=data, headers={"Content-Type": "application/json"})

    def workflows(self) -> list[dict[str, Any]]:
        """The saved workflows this tenant may name: ``name``, ``owner`` (shared or tenant), ``latest``."""
        return list(self._call("GET", "/v1/workflows", json_object)["workflows"])

    def workflow(self, ref: str) -> dict[str, Any]:
        """One saved version (``name@version``) or the latest (``name``): its parameters and what it needs."""
        return self._call("GET", "/v1/workflows/" + urllib.parse.quote(ref, safe="@"), json_object)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job view: state, outputs (index, sha256, bytes, href), cost, error."""
        return self._call("GET", _job_path(job_id), json_object)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job (or ask a running one to stop); ``JobFinished`` if it completed or failed."""
        return self._call("POST", _job_path(job_id, "cancel"), json_object)

    def wait(self, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Poll the job until it is completed, failed or cancelled, and return that view;
        ``DeadlineExceeded`` if ``timeout`` seconds pass first (None: as long as the job takes)."""
        until = None if timeout is None else self._clock() + timeout
        pause = POLL_FIRST
        while True:
            left = None if until is None else until - self._clock()
            view = self._call("GET", _job_path(job_id), json_object,
                              deadline=self.deadline if left is None else max(min(self.deadline, left), 0.001))
            if view["state"] in TERMINAL:
                return view
            if until is not None and self._clock() + pause > until:
                raise DeadlineExceeded(f"job {job_id} is still {view['state']} after {timeout} s")
            self._sleep(pause)
            pause = min(POLL_CAP, pause * 2)

    def run(self, intent: str, body: Mapping[str, Any], wait: float | None = None) -> dict[str, Any]:
        """Submit ``body`` as ``intent`` and return the job's view once it is completed, failed or cancelled:
        the submission is held until the job ends (``Prefer: wait``, on the streams process when the client
        has its URL), then a read of the job held the same way while it has not. A dropped connection is
        asked again (the same key: the same job). Where the API does not hold a request (no
        ``Preference-Applied``) it polls as ``wait`` does. ``DeadlineExceeded`` if ``wait`` seconds (None: as
        long as the job takes) pass first."""
        until = None if wait is None else self._clock() + wait
        data = json.dumps(body, allow_nan=False).encode()
        headers = {"Idempotency-Key": idempotency_key(intent), "Content-Type": "application/json"}
        view, held = self._held("POST", "/v1/jobs", until, body=data, headers=headers)
        while view["state"] not in TERMINAL:
            left = None if until is None else until - self._clock()
            if not held:
                return self.wait(view["id"], None if left is None else max(left, 0.001))
            if left is not None and left <= 0:
                raise DeadlineExceeded(f"job {view['id']} is still {view['state']} after {wait} s")
            view, held = self._held("GET", _job_path(view["id"]), until)
        return view

    def _held(self, method: str, path: str, until: float | None, *, body: bytes | None = None,
              headers: Mapping[str, str] | None = None) -> tuple[dict[str, Any], bool]:
        """The job's view from one request held up to ``WAIT_ASK`` s (less when ``until`` comes first), and
        whether the API held it; retried as every call is, within the client's deadline and the wait."""
        ask = WAIT_ASK if until is None else max(0, min(WAIT_ASK, math.ceil(until - self._clock())))

        def read(resp: http.client.HTTPResponse) -> tuple[dict[str, Any], bool]:
            return json_object(resp), resp.getheader("Preference-Applied") is not None

        return self._call(method, path, read, body=body, headers={**(headers or {}), "Prefer": f"wait={ask}"},
                          deadline=self.deadline + ask, transport=self._streams, timeout=self.timeout + ask)

    def events(self, job_id: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """The job's events with ``seq`` above ``after``, each once and in order, from its event
        stream; reopened from the last ``seq`` seen when it ends or breaks, until the job's terminal
        event (or a 204: nothing left). Opening a stream ends by the deadline, and each line of it
        comes within ``STREAM_SILENCE`` (else it counts as broken); from a failure on, ``deadline``
        bounds the time until a stream gives a message again, reopenings included."""
        last, pause, since, tries = after, RECONNECT, None, 0
        silence = max(self.timeout, STREAM_SILENCE)
        while True:
            started = self._clock() if since is None else since  # the stretch without a message began
            heard = False  # this stream gave a message: a failure then starts the stretch anew
            bound = Deadline(started + self.deadline, self._clock)
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self._streams.exchange("GET", _job_path(job_id, f"events/stream?after={last}"),
                                              headers=self._auth | headers, body=None, timeout=silence,
                                              deadline=bound) as resp:
                    if resp.status == 204:
                        return
                    if resp.status >= 300:
                        raise failure(resp)

                    def line() -> bytes:  # the stream is open: each line within the silence bound
                        bound.until = self._clock() + silence
                        return resp.readline()

                    for message in sse.messages(line):
                        since, tries, heard = None, 0, True
                        pause = pause if message.retry is None else message.retry / 1000
                        event = _event(message)
                        if event is None or event["seq"] <= last:
                            continue
                        last = event["seq"]
                        yield event
                        if event["type"] == "state" and event.get("to") in TERMINAL:
                            return
                self._sleep(pause)  # the stream ended on its own (the API's time limit): reopen
                continue
            except ReckonError as refused:
                if not refused.retryable:
                    raise
                error: Exception = refused
            except TRANSPORT_ERRORS as broken:
                error = broken
            tries += 1
            since = self._clock() if heard else started
            wait = max(pause, self._backoff.wait(tries, getattr(error, "retry_after", None)))
            if self._clock() + wait - since > self.deadline:
                raise _gave_up(error, tries)
            self._sleep(wait)

    def download(self, job_id: str, index: int, dest: str | os.PathLike[str] | IO[bytes]) -> dict[str, Any]:
        """Fetch output ``index`` into ``dest`` (a path, or a binary file object) and return its entry
        of the job view. The bytes are checked against that entry's sha256 before anything reaches
        ``dest``: a path is written to a temporary file beside it and renamed into place; a file
        object is written only once the bytes check. ``IntegrityError`` on a mismatch. ``deadline``
        bounds the whole: the view and the bytes."""
        until = self._clock() + self.deadline
        listed: list[dict[str, Any]] = self._call("GET", _job_path(job_id), json_object, until=until)["outputs"]
        output = next((o for o in listed if o["index"] == index), None)
        if output is None:
            raise OutputNotFound(f"job {job_id} lists no stored output {index}")
        if not isinstance(dest, (str, os.PathLike)):
            with tempfile.SpooledTemporaryFile(max_size=SPOOL) as held:
                self._fetch(job_id, index, output["sha256"], held, until)
                held.seek(0)
                shutil.copyfileobj(held, dest, CHUNK)
            return output
        target = Path(dest)
        fd, part = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        try:
            with os.fdopen(fd, "w+b") as sink:
                self._fetch(job_id, index, output["sha256"], sink, until)
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(part, target)
        except BaseException:
            Path(part).unlink(missing_ok=True)
            raise
        return output

    def _fetch(self, job_id: str, index: int, sha256: str, sink: IO[bytes], until: float) -> None:
        def save(resp: http.client.HTTPResponse) -> str:
            sink.seek(0)
            sink.truncate()
            digest, received = hashlib.sha256(), 0
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                received += len(chunk)
                try:
                    sink.write(chunk)
                except OSError as err:
                    raise _LocalError() from err
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and received < int(length):
                raise http.client.IncompleteRead(b"", int(length) - received)  # cut off: try again
            return digest.hexdigest()

        actual = self._call("GET", _job_path(job_id, f"outputs/{index}"), save, until=until)
        if actual != sha256:
            raise IntegrityError(f"output {index} of job {job_id} has sha256 {actual}, the job lists {sha256}",
                                 expected=sha256, actual=actual)

    def _call(self, method: str, path: str, read: Callable[[http.client.HTTPResponse], T], *,
              body: bytes | None = None, headers: Mapping[str, str] | None = None,
              deadline: float | None = None, until: float | None = None, transport: Transport | None = None,
              timeout: float | None = None) -> T:
        """One request, tried again with the same bytes while it may succeed, until ``deadline``
        (default: the client's) has passed, or the clock reads ``until`` (a call of several requests);
        ``read`` turns a 2xx answer into the result; ``transport`` and ``timeout`` default to the client's. Every try's connect, send and read end by then."""
        if until is None:
            until = self._clock() + (self.deadline if deadline is None else deadline)
        tries = 0
        while True:
            tries += 1
            try:
                with (transport or self._transport).exchange(
                        method, path, headers=self._auth | dict(headers or {}), body=body,
                        timeout=timeout or self.timeout, deadline=Deadline(until, self._clock)) as resp:
                    if resp.status < 300:
                        return read(resp)
                    error: Exception = failure(resp)
            except _LocalError as local:
                raise local.__cause__ from None  # type: ignore[misc]
            except TRANSPORT_ERRORS as broken:
                error = broken
            if isinstance(error, ReckonError) and not error.retryable:
                raise error
            wait = self._backoff.wait(tries, getattr(error, "retry_after", None))
            if self._clock() + wait > until:
                raise _gave_up(error, tries)
            self._sleep(wait)


def batch_key(intent: str) -> str:
    """A batch's ``Idempotency-Key``: as ``idempotency_key``, within the 250 characters a batch's key may have."""
    key = idempotency_key(intent)
    return key if len(key) <= 250 else "sha256." + hashlib.sha256(intent.encode()).hexdigest()


def _batch_path(batch_id: str, *rest: str) -> str:
    return "/".join(["/v1/batches", urllib.parse.quote(batch_id, safe=""), *rest])


def _job_path(job_id: str, *rest: str) -> str:
    return "/".join(["/v1/jobs", urllib.parse.quote(job_id, safe=""), *rest])


def _event(message: sse.Message) -> dict[str, Any] | None:
    """The event a message carries (None for a message that only sets ``retry``); a final ``end`` (the key
    was refused while the stream was open) raises its problem's exception (``Unauthorized``)."""
    if message.data is None:
        return None
    try:
        event = json.loads(message.data)
    except ValueError:
        raise ProtocolError(f"event {message.id} is not JSON") from None
    if message.event == "end" and isinstance(event, dict):
        status = event.get("status")
        raise from_problem(status if isinstance(status, int) else 401, event)
    if not isinstance(event, dict) or not isinstance(event.get("seq"), int):
        raise ProtocolError(f"event {message.id} has no seq")
    return event


def _gave_up(error: Exception, tries: int) -> ReckonError:
    """What a call that ran out of time raises: the last answer's typed exception (429, 503, 409 in
    progress), or ``DeadlineExceeded`` when the last try got no answer."""
    if isinstance(error, ReckonError):
        return error
    exceeded = DeadlineExceeded(f"no answer before the deadline ({tries} tries; last: {error!r})")
    exceeded.__cause__ = error
    return exceeded
