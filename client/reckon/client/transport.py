"""One HTTP exchange with the API over the standard library's ``http.client``: a connection per
exchange, closed after it, with a timeout on the connect and on every read, and a deadline on the
whole: every socket operation waits at most what is left of it, and none starts once it passed (a
server that trickles its answer a byte at a time satisfies every read's timeout, never the deadline)."""

from __future__ import annotations

import http.client
import io
import json
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from reckon.client.errors import ProtocolError, ReckonError, from_problem
from reckon.client.retry import retry_after

#: Opens a connection: (scheme, host, port, timeout in s) -> a connection not yet connected.
Connect = Callable[[str, str, int, float], http.client.HTTPConnection]

#: The most of an error answer's body that is read (a problem is a few hundred bytes).
MAX_PROBLEM_BYTES = 64 * 1024
USER_AGENT = "reckon-client/0.1"

#: Errors of the network or of a connection cut mid-answer: the request may or may not have arrived.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


def connect(scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


class Deadline:
    """When an exchange must be over (``until``, on ``clock``, the client's monotonic clock); the caller
    may move ``until`` while it reads (an event stream bounds each line, not the whole stream)."""

    def __init__(self, until: float, clock: Callable[[], float]) -> None:
        self.until, self.clock = until, clock

    def left(self, most: float) -> float:
        """What an operation may wait (s): ``most``, or less if the deadline comes first; a
        ``TimeoutError`` if it passed."""
        left = self.until - self.clock()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        return min(most, left)


class _Bounded:
    """A connected socket whose every send and read waits at most ``timeout`` and what is left of the
    deadline. ``http.client`` sends through ``sendall`` and reads the answer through ``makefile``."""

    def __init__(self, sock: socket.socket, deadline: Deadline, timeout: float) -> None:
        self._sock, self._deadline, self._timeout = sock, deadline, timeout

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(self._deadline.left(self._timeout))  # a timeout bounds all of a sendall
        self._sock.sendall(data)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self._sock.settimeout(self._deadline.left(self._timeout))
        return self._sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing: ``http.client`` closes the connection as soon as an answer that ends it has begun,
        before its body is read; the exchange closes the socket itself, after the caller read it."""

    _decref_socketios = close  # what the answer's file calls when it closes

    def __getattr__(self, name: str) -> Any:  # close, fileno, ...: the socket's own
        return getattr(self._sock, name)


class Transport:
    """Requests to one API at ``base_url`` (``http`` or ``https``; a path in it prefixes every route)."""

    def __init__(self, base_url: str, *, connect: Connect = connect) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url must be an http or https URL, not {base_url!r}")
        self.scheme, self.host = url.scheme, url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self._connect = connect

    @contextmanager
    def exchange(self, method: str, path: str, *, headers: dict[str, str], body: bytes | None,
                 timeout: float, deadline: Deadline) -> Iterator[http.client.HTTPResponse]:
        """Send one request and yield its answer, whose body the caller reads inside the block: the
        connect (TLS handshake included), the send and every read wait at most ``timeout`` each and
        end by ``deadline`` (``TimeoutError``)."""
        conn = self._connect(self.scheme, self.host, self.port, deadline.left(timeout))
        raw: socket.socket | None = None
        try:
            conn.connect()
            raw = conn.sock
            conn.sock = _Bounded(raw, deadline, timeout)  # type: ignore[arg-type, assignment]
            conn.request(method, self.prefix + path, body=body, headers={"User-Agent": USER_AGENT, **headers})
            yield conn.getresponse()
        finally:
            conn.close()
            if raw is not None:
                raw.close()


def failure(resp: http.client.HTTPResponse) -> ReckonError:
    """The typed exception of an error answer (its body read here)."""
    raw = resp.read(MAX_PROBLEM_BYTES)
    problem: dict[str, Any] = {"status": resp.status, "title": resp.reason}
    if "json" in (resp.getheader("Content-Type") or ""):
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            problem = parsed
    return from_problem(resp.status, problem, retry_after(resp.getheader("Retry-After")))


def json_object(resp: http.client.HTTPResponse) -> dict[str, Any]:
    """A 2xx answer's JSON object (a job view, a 202's job)."""
    raw = resp.read()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ProtocolError(f"{resp.status} answer is not a JSON object ({len(raw)} bytes)")
    return parsed
