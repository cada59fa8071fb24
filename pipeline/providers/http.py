"""A small HTTP client for providers that never retries and classifies every failure.

The routing middleware is the one layer that retries; this client only says
what is known: nothing was sent (transient), or the request went out and its
answer was lost (unknown outcome, for requests that are not safe to repeat).
"""

from __future__ import annotations

import http.client
import io
import re
import secrets
import socket
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from pipeline import faultpoints
from pipeline.errors import (
    InvalidInput,
    PolicyRejected,
    ProviderAuthFailed,
    RateLimited,
    Transient,
    UnknownOutcome,
    Unreachable,
)

#: Seconds to wait for connect and for each read.
DEFAULT_TIMEOUT = 10.0
#: Seconds a whole answer (status line, headers, body, chunk framing) may take to arrive, unless the
#: caller gives its own limit (an output download): a server that trickles bytes, each inside the
#: read timeout, cannot hold a thread (the watcher's, a worker's) for longer.
DEFAULT_TOTAL = 2 * DEFAULT_TIMEOUT
#: Bytes asked of the socket at a time while a response's body is read, and handed to it at a time
#: while a request's body is sent (each block within the timeout).
CHUNK = 64 * 1024
#: Bytes per second a request's body is allowed at least: it may take ``total`` plus its size at
#: this rate to go out (an input's upload over a slow link), each block of it within the timeout,
#: never longer (a server reading it a little at a time cannot hold a thread).
DEFAULT_SEND_RATE = 1024 * 1024
#: Retry-After delay-seconds: ASCII digits only (``str.isdigit`` also accepts "²", which float refuses).
_SECONDS_RE = re.compile(r"[0-9]{1,9}")
#: Methods that change nothing at the server: an answer lost to them is safe to ask again.
SAFE = ("GET", "HEAD")


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class HttpTransport:
    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT, total: float = DEFAULT_TOTAL,
                 send_rate: float = DEFAULT_SEND_RATE) -> None:
        """``timeout``: connect, each read and each block sent; ``total``: a whole answer, unless a
        request says; ``send_rate``: bytes per second a request's body is allowed beyond ``total``."""
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.timeout, self.total, self.send_rate = timeout, total, send_rate

    def request(self, method: str, path: str, body: bytes | None = None, *,
                accept: Collection[int] = (), limit: float | None = None,
                content_type: str = "application/json") -> Response:
        """One request; raises a classified ProviderError for anything but a 2xx or a status in
        ``accept`` (which the caller reads itself, e.g. ComfyUI's 400 explaining a refused graph).
        ``limit``: seconds the answer may take to arrive once the request is sent (default
        ``total``); every read is also cut at the timeout. ``content_type``: the body's (``multipart``)."""
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        try:
            try:
                conn.connect()
            except OSError as exc:  # refused, unroutable, or no answer to connect: nothing was sent
                raise Unreachable("connect_failed") from exc
            headers = {"Content-Type": content_type, "Content-Length": str(len(body))} if body is not None else {}
            sent_by = time.monotonic() + self.total + len(body or b"") / self.send_rate
            until = None
            try:
                conn.request(method, path, body=None if body is None else _blocks(body, sent_by), headers=headers)
                until = time.monotonic() + (self.total if limit is None else limit)
                response = _read(conn, until, self.timeout)
            except (OSError, http.client.HTTPException) as exc:
                if until is None:
                    reason = "request_too_slow" if time.monotonic() >= sent_by else "response_lost"
                else:
                    reason = "response_too_slow" if time.monotonic() >= until else "response_lost"
                if method in SAFE:
                    raise Transient(reason) from exc
                raise UnknownOutcome(reason) from exc
        finally:
            conn.close()
        if response.status not in accept:
            raise_for_status(method, response)
        return response


def _blocks(body: bytes, sent_by: float) -> Iterator[memoryview]:
    """``body`` in blocks of CHUNK (each sent within the socket's timeout), none once ``sent_by`` has passed."""
    view = memoryview(body)
    for start in range(0, len(view), CHUNK):
        if time.monotonic() >= sent_by:
            raise TimeoutError("request_too_slow")
        if start == CHUNK:  # the first block is out, the rest not: an upload cut by a crash
            faultpoints.reached("body_partly_sent")
        yield view[start:start + CHUNK]


def _read(conn: http.client.HTTPConnection, until: float, timeout: float) -> Response:
    """The whole answer, every read of it (status line, headers, chunk sizes, trailers, body) cut
    at the timeout and not let past ``until``."""
    sock = conn.sock
    assert sock is not None, "read after the request was sent"
    conn.sock = _BoundedSocket(sock, until, timeout)  # type: ignore[assignment]
    try:
        raw = conn.getresponse()
        try:
            chunks: list[bytes] = []
            while chunk := raw.read1(CHUNK):
                chunks.append(chunk)
            if raw.length:  # closed before Content-Length bytes came
                raise http.client.IncompleteRead(b"".join(chunks), raw.length)
            return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, b"".join(chunks))
        finally:
            raw.close()
    finally:
        sock.close()  # here, not by the connection: a Connection: close answer is read after it closes


class _BoundedSocket:
    """The connection's socket as http.client's response reads it (``makefile``): each receive
    waits at most the timeout and ends the answer once ``until`` has passed."""

    def __init__(self, sock: socket.socket, until: float, timeout: float) -> None:
        self._sock, self._until, self._timeout = sock, until, timeout

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_BoundedReader(self))

    def recv_into(self, buffer: memoryview) -> int:
        left = self._until - time.monotonic()
        if left <= 0:
            raise TimeoutError("response_too_slow")
        self._sock.settimeout(min(self._timeout, left))
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        """The connection lets go of it (``_read`` closes the socket once the answer is read)."""


class _BoundedReader(io.RawIOBase):
    def __init__(self, sock: _BoundedSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self._sock.recv_into(buffer)


def multipart(fields: dict[str, str], file_field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body (RFC 7578) of text ``fields`` and one file, and its content type.
    ``filename`` and the field names must need no quoting (reckon's input names are hex and a dot)."""
    boundary = secrets.token_hex(16)
    while boundary.encode() in data:  # never, in practice: the boundary must not occur in the file
        boundary = secrets.token_hex(16)
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{filename}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n".encode())
    return b"".join(parts) + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def raise_for_status(method: str, response: Response) -> None:
    status = response.status
    if status < 300:
        return
    if status == 429:
        raise RateLimited("rate_limited", retry_after=retry_after(response.headers.get("retry-after")))
    if status == 401:
        raise ProviderAuthFailed("credentials_refused")
    if status == 403:
        raise PolicyRejected("policy_rejected")
    if status < 500:
        raise InvalidInput(f"provider_http_{status}")
    if method in SAFE:  # a read changes nothing: safe to repeat; the server is failing, not the job
        raise Unreachable(f"provider_http_{status}")
    raise UnknownOutcome(f"provider_http_{status}")  # it may have been queued: reconcile decides


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS_RE.fullmatch(value):
        return float(value)
    try:
        moment = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, moment - (time.time() if now is None else now))
