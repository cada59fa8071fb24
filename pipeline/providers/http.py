"""A small HTTP client for providers that never retries and classifies every failure.

The routing middleware is the one layer that retries; this client only says
what is known: nothing was sent (transient), or the request went out and its
answer was lost (unknown outcome, for requests that are not safe to repeat).
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from ..errors import (
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
#: Bytes asked of the socket at a time while a response's body is read.
CHUNK = 64 * 1024
#: Retry-After delay-seconds: ASCII digits only (``str.isdigit`` also accepts "²", which float refuses).
_SECONDS_RE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class HttpTransport:
    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.timeout = timeout

    def request(self, method: str, path: str, body: bytes | None = None, *,
                accept: Collection[int] = (), limit: float | None = None) -> Response:
        """One request; raises a classified ProviderError for anything but a 2xx or a status in
        ``accept`` (which the caller reads itself, e.g. ComfyUI's 400 explaining a refused graph).
        ``limit``: seconds the whole exchange may take (every read is also cut at the timeout), so
        a server that trickles its answer, each byte inside the timeout, cannot hold a thread."""
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        until = None if limit is None else time.monotonic() + limit
        try:
            try:
                conn.connect()
            except OSError as exc:  # refused, unroutable, or no answer to connect: nothing was sent
                raise Unreachable("connect_failed") from exc
            headers = {"Content-Type": "application/json"} if body is not None else {}
            try:
                conn.request(method, path, body=body, headers=headers)
                response = self._read(conn, until)
            except (OSError, http.client.HTTPException) as exc:
                reason = "response_too_slow" if until is not None and time.monotonic() >= until else "response_lost"
                if method == "GET":
                    raise Transient(reason) from exc
                raise UnknownOutcome(reason) from exc
        finally:
            conn.close()
        if response.status not in accept:
            raise_for_status(method, response)
        return response

    def _read(self, conn: http.client.HTTPConnection, until: float | None) -> Response:
        """The response, read a chunk at a time; past ``until`` the socket times out (an OSError).
        The socket is taken before the headers: a response that closes the connection
        (``Connection: close``) detaches it from ``conn`` but is still read from it."""
        sock = conn.sock
        self._bound(sock, until)
        raw = conn.getresponse()
        try:
            chunks: list[bytes] = []
            while True:
                self._bound(sock, until)
                chunk = raw.read1(CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
            if raw.length:  # closed before Content-Length bytes came
                raise http.client.IncompleteRead(b"".join(chunks), raw.length)
            return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, b"".join(chunks))
        finally:
            raw.close()

    def _bound(self, sock: socket.socket | None, until: float | None) -> None:
        """The next read waits at most the timeout, and not past ``until``."""
        if until is None or sock is None:
            return
        left = until - time.monotonic()
        if left <= 0:
            raise TimeoutError("response_too_slow")
        sock.settimeout(min(self.timeout, left))


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
    if method == "GET":  # a read changes nothing: safe to repeat; the server is failing, not the job
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
