"""The one HTTP request a webhook delivery makes: POST the body, refused toward private addresses.

Each hop's host is resolved once and the request goes to an address that was checked (so a name that
resolves elsewhere a moment later cannot redirect it); every address it resolves to must be global
(no loopback, private, link-local, shared, multicast or reserved one) unless the operator allows private
ones (``RECKON_WEBHOOK_ALLOW_PRIVATE``). Redirects (307 and 308, which keep the POST) are followed only
up to ``max_redirects`` (0 by default: none), each target checked the same way. The whole request, every
hop included, has ``timeout`` seconds; at most ``MAX_RESPONSE_BYTES`` of an answer are read.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urljoin, urlsplit

#: Bytes of an answer read, at most (the rest is never read).
MAX_RESPONSE_BYTES = 64 * 1024
_REDIRECTS = (307, 308)

Resolve = Callable[[str, int], list[str]]


class Refused(Exception):
    """The request was not sent: its address is not allowed, or its URL cannot be requested."""


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    body: bytes


def check_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL a webhook may be sent to; Refused otherwise."""
    if not all(33 <= ord(c) <= 126 for c in url):
        raise Refused("a URL is printable ASCII: no spaces or control characters (percent-encode the rest)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused(f"not a URL: {exc}") from None
    if port == 0:
        raise Refused("port 0 is no port")
    port = port or (443 if parts.scheme == "https" else 80)
    if parts.scheme not in ("http", "https"):
        raise Refused("only http and https URLs")
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise Refused("a URL needs a host and no user name or password")
    return parts.scheme, parts.hostname, port


#: IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, IPv4-compatible): that one is checked.
_EMBEDDING = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"),
              ipaddress.ip_network("::/96"))
#: Special-purpose blocks some Python versions count as global (IETF protocol assignments, benchmarking).
_SPECIAL = (ipaddress.ip_network("192.0.0.0/24"), ipaddress.ip_network("198.18.0.0/15"))


def allowed(address: str, allow_private: bool) -> bool:
    """Whether a request may go to ``address``: a global unicast address, and for an IPv6 address that
    carries an IPv4 one (mapped, NAT64, 6to4, Teredo, compatible), that one too."""
    if allow_private:
        return True
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if not (ip.is_global and not ip.is_multicast and not ip.is_reserved):
        return False
    if isinstance(ip, ipaddress.IPv4Address) and any(ip in net for net in _SPECIAL):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local:
            return False
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and any(ip in net for net in _EMBEDDING):
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None:
            return allowed(str(inner), False)
    return True


def resolve(host: str, port: int) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def checked_address(host: str, port: int, allow: Callable[[str], bool], resolver: Resolve = resolve) -> str:
    """An address of ``host`` to connect to, when ``allow`` allows every address it resolves to."""
    try:
        addresses = resolver(host, port)
    except OSError as exc:
        raise Refused(f"cannot resolve the host: {exc.strerror or exc}") from None
    if not addresses:
        raise Refused("the host resolves to no address")
    if not all(allow(address) for address in addresses):
        raise Refused("the host resolves to a private, loopback or link-local address")
    return addresses[0]


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float, allow_private: bool,
         max_redirects: int = 0, resolver: Resolve = resolve, allow: Callable[[str], bool] | None = None) -> Answer:
    """POST ``body`` to ``url``; the answer, or Refused, or OSError (timeout, refused, reset...). ``allow``
    (an address -> whether it may be connected to) replaces the rule ``allowed`` for tests."""
    allow = allow or (lambda address: allowed(address, allow_private))
    deadline = time.monotonic() + timeout
    for hop in range(max_redirects + 1):
        scheme, host, port = check_url(url)
        address = checked_address(host, port, allow, resolver)
        answer, location = _send(scheme, host, port, address, url, body, headers, deadline)
        if answer.status not in _REDIRECTS or location is None or hop == max_redirects:
            return answer
        url = urljoin(url, location)
    raise AssertionError("unreachable")


def _left(deadline: float) -> float:
    """Seconds to the deadline: each read waits at most this long, and the watchdog ends the rest."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the webhook request took longer than its timeout")
    return left


def _send(scheme: str, host: str, port: int, address: str, url: str, body: bytes, headers: dict[str, str],
          deadline: float) -> tuple[Answer, str | None]:
    connection = (_PinnedHTTPS if scheme == "https" else _PinnedHTTP)(host, port, address, _left(deadline))
    # A receiver that sends its handshake, status line, headers or chunk sizes a byte at a time resets each
    # read's timeout: at the deadline the socket is shut, whatever is being read.
    watchdog = threading.Timer(_left(deadline), _shut, (connection,))
    watchdog.daemon = True
    watchdog.start()
    try:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        chunks, size = [], 0
        while size < MAX_RESPONSE_BYTES:
            chunk = response.read1(MAX_RESPONSE_BYTES - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        answer = Answer(response.status, response.getheader("Retry-After"), b"".join(chunks))
        location = response.getheader("Location")
    except (OSError, http.client.HTTPException):
        if time.monotonic() >= deadline:
            raise TimeoutError("the webhook request took longer than its timeout") from None
        raise
    finally:
        watchdog.cancel()
        connection.close()
    if time.monotonic() >= deadline:
        raise TimeoutError("the webhook request took longer than its timeout")
    return answer, location


def _shut(connection: http.client.HTTPConnection) -> None:
    sock = getattr(connection, "raw", None) or connection.sock
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        self.sock = self.raw = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """Connects to the checked address; TLS verifies the certificate against the host's name."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        self.raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(self.raw, server_hostname=self.host)
