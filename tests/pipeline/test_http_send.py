"""A request's body is sent under a bound of its own: a large input's upload to a server that reads it
steadily, if slowly, goes out; one a server reads too slowly to ever finish is cut, so a thread (and
the stall bound over it) is never held at the server's pleasure."""

from __future__ import annotations

import socket
import threading
import time

import orjson
import pytest

from pipeline.errors import UnknownOutcome
from pipeline.providers.http import HttpTransport

#: Many times a loopback socket's send and receive buffers together, so most of it goes only as fast
#: as the server reads.
BODY = bytes(48 * 1024 * 1024)
#: Bytes the server asks of its socket at a time (its receive buffer too).
BLOCK = 1024 * 1024


class Reader:
    """A server that reads one request BLOCK bytes at a time, ``pause`` seconds apart, then answers."""

    def __init__(self, pause: float) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BLOCK)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.pause, self.received, self.stop = pause, 0, threading.Event()
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(10)  # the test stops it whatever the client does
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1024)
            _, _, rest = head.partition(b"\r\n\r\n")
            self.received = len(rest)
            try:
                while self.received < len(BODY) and not self.stop.wait(self.pause):
                    data = conn.recv(BLOCK)
                    if not data:
                        return
                    self.received += len(data)
                if self.received == len(BODY):
                    answer = orjson.dumps({"received": self.received})
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
            except OSError:  # the client hung up
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.listener.close()


@pytest.fixture
def reader():
    made: list[Reader] = []
    yield lambda pause: made.append(Reader(pause)) or made[-1]
    for server in made:
        server.close()


def test_a_body_a_server_reads_steadily_goes_out_however_long_it_takes_beyond_the_timeout(reader) -> None:
    """48 MiB read a MiB at a time every 50 ms (at most 20 MiB/s): seconds, each block well inside the
    1 s timeout. The timeout bounds each block sent, not the whole body (it once did: an input larger
    than the timeout's worth of bandwidth could never be uploaded, however healthy the server)."""
    server = reader(0.05)
    answer = HttpTransport(server.url, timeout=1, total=5).request("POST", "/upload/image", BODY)
    assert orjson.loads(answer.body) == {"received": len(BODY)}


def test_a_body_a_server_reads_too_slowly_is_cut_at_its_bound(reader) -> None:
    """A MiB every 0.3 s, each block inside the 5 s timeout: the 48 MiB would take 15 s. Cut once the
    total limit plus the body's size at ``send_rate`` (0.5 + 0.75 s) has passed, as a request whose
    outcome is unknown (it went out in part)."""
    server = reader(0.3)
    transport = HttpTransport(server.url, timeout=5, total=0.5, send_rate=64 * 1024 * 1024)
    began = time.monotonic()
    with pytest.raises(UnknownOutcome) as caught:
        transport.request("POST", "/upload/image", BODY)
    assert caught.value.reason == "request_too_slow"
    assert time.monotonic() - began < 10 and server.received < len(BODY)  # not the 15 s it would take
