"""A loopback TCP proxy in front of one port, for the faults a real network has between the client
and the API (or a process and Redis): it records each connection's bytes both ways, cuts an event stream
just after a given marker, flips one byte of an output's body, and splits the network (every connection
closed, new ones refused) until healed. Threads only, all joined by ``stop``."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

#: The byte of an output's body that ``corrupt_outputs`` flips (inside a PNG's IHDR chunk).
CORRUPTED_BYTE = 16


@dataclass
class Exchange:
    """One connection: what the client sent, what it was answered, and when it was opened (monotonic)."""

    opened: float
    request: bytearray = field(default_factory=bytearray)
    response: bytearray = field(default_factory=bytearray)

    def header(self, name: str, *, answer: bool = False) -> str | None:
        """A header of the request (or of the answer), from its first block."""
        head = bytes(self.response if answer else self.request).split(b"\r\n\r\n", 1)[0].decode("latin-1")
        for line in head.split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None

    @property
    def status(self) -> int | None:
        """The answer's status code, None if nothing was answered."""
        line = bytes(self.response).split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 else None


class Proxy:
    """Listens on 127.0.0.1:``port`` and forwards every connection to 127.0.0.1:``upstream``.

    ``cut_stream_after``: the first ``cuts`` connections that ask for an event stream are closed
    right after the answer's bytes that end with this marker. ``corrupt_outputs``: every answer of
    an output download has its body's byte ``CORRUPTED_BYTE`` flipped (same length)."""

    def __init__(self, upstream: int, *, cut_stream_after: bytes | None = None, cuts: int = 1,
                 corrupt_outputs: bool = False) -> None:
        self.upstream, self.marker, self.cuts, self.corrupt = upstream, cut_stream_after, cuts, corrupt_outputs
        self.exchanges: list[Exchange] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped, self._split = threading.Event(), threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept")]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, start: bytes) -> list[Exchange]:
        """The connections whose request starts with ``start`` (b"POST /v1/jobs "), in order."""
        with self._lock:
            return [e for e in self.exchanges if bytes(e.request).startswith(start)]

    def split(self) -> None:
        """Close every connection and refuse new ones (each accepted and closed at once) until ``heal``."""
        self._split.set()
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    def heal(self) -> None:
        self._split.clear()

    def stop(self) -> None:
        """Stop accepting, close every connection, and join every thread."""
        self._stopped.set()
        self._threads[0].join(timeout=10)
        with self._lock:
            for sock in self._sockets:
                _close(sock)
        for thread in self._threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), thread.name
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                downstream, _ = self._listener.accept()
            except TimeoutError:
                continue
            if self._split.is_set():
                _close(downstream)
                continue
            downstream.settimeout(None)
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            exchange = Exchange(time.monotonic())
            with self._lock:
                self.exchanges.append(exchange)
                self._sockets += [downstream, upstream]
                pumps = [threading.Thread(target=self._up, args=(downstream, upstream, exchange), name="proxy-up"),
                         threading.Thread(target=self._down, args=(upstream, downstream, exchange), name="proxy-down")]
                self._threads += pumps
            for pump in pumps:
                pump.start()

    def _up(self, source: socket.socket, sink: socket.socket, exchange: Exchange) -> None:
        """Client to API: recorded before it is forwarded, so an answer always finds its request."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    exchange.request += data
                sink.sendall(data)
        _close(source)
        _close(sink)

    def _down(self, source: socket.socket, sink: socket.socket, exchange: Exchange) -> None:
        """API to client, with the faults; the request line is known once the API answers."""
        cut: bool | None = None
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                line = bytes(exchange.request.split(b"\r\n", 1)[0])
                if cut is None:
                    cut = self.marker is not None and b"/events/stream" in line and self._take_cut()
                if self.corrupt and b"/outputs/" in line:
                    data = _flip(bytes(exchange.response), data)
                at = (bytes(exchange.response[-len(self.marker):]) + data).find(self.marker) if cut else -1
                if self.marker is not None and at >= 0:  # keep data up to the marker's end, then hang up
                    data = data[: at + len(self.marker) - min(len(exchange.response), len(self.marker))]
                with self._lock:
                    exchange.response += data
                sink.sendall(data)
                if at >= 0:
                    break
        _close(source)
        _close(sink)

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cuts > 0:
                self.cuts -= 1
                return True
        return False


def _flip(before: bytes, data: bytes) -> bytes:
    """``data`` with the body's byte ``CORRUPTED_BYTE`` flipped, if it falls in ``data`` (``before``
    is the answer so far; a 200 answer only)."""
    whole = before + data
    end = whole.find(b"\r\n\r\n")
    if not whole.startswith(b"HTTP/1.1 200") or end < 0:
        return data
    at = end + 4 + CORRUPTED_BYTE - len(before)
    if not 0 <= at < len(data):
        return data
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
