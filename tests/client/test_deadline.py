"""The client's deadline bounds a call whole, reads included: against a loopback server that trickles
its answers a byte every 80 ms (each read gets a byte well within the 1 s timeout, so only the deadline
can end the call), ``job``, ``download`` and ``events`` raise ``DeadlineExceeded`` once the deadline
passed, where they used to read on for the whole answer (tens of seconds here)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reckon.client import Client, DeadlineExceeded

JOB = "acme.0123456789abcdef0123"
#: What a trickled answer sends a byte at a time, and how often (s).
TRICKLE_S = 0.08
#: The client's limits: each read 1 s, each call 2 s.
TIMEOUT, DEADLINE = 1.0, 2.0
#: Past the deadline, what a raise may take on a loaded machine (s); a trickled answer lasts 20 s or more.
MARGIN = 2.0
OUTPUT = b"\x89PNG" + bytes(range(256))
PADDING = "x" * 200  # makes every trickled answer's head alone last 16 s


def answer(status: str, content_type: str, body: bytes, *, length: bool = True) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nX-Padding: {PADDING}\r\n"
    head += f"Content-Length: {len(body)}\r\n" if length else "Cache-Control: no-cache\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


def view() -> bytes:
    output = {"index": 0, "sha256": hashlib.sha256(OUTPUT).hexdigest(), "bytes": len(OUTPUT)}
    return json.dumps({"id": JOB, "state": "completed", "outputs": [output], "padding": PADDING}).encode()


class Trickler:
    """Answers each request on 127.0.0.1 with ``respond(request line)``: (bytes sent at once, bytes sent
    one every ``TRICKLE_S``); records each request line; ``stop`` closes everything and joins its threads."""

    def __init__(self, respond: Callable[[str], tuple[bytes, bytes]]) -> None:
        self.respond, self.requests, self.reset = respond, [], False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="trickler-accept")]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), name="trickler-serve")
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request and (data := conn.recv(65536)):
                request += data
            line = request.split(b"\r\n", 1)[0].decode()
            self.requests.append(line)
            at_once, slowly = self.respond(line)
            conn.sendall(at_once)
            for i in range(len(slowly)):
                if self._stopped.wait(TRICKLE_S):
                    return
                conn.sendall(slowly[i:i + 1])
            if self.reset:  # a connection reset, not a clean end: the client sees the stream break
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def stop(self) -> None:
        self._stopped.set()
        for thread in list(self._threads):
            thread.join(timeout=10)
            assert not thread.is_alive(), thread.name
        self._listener.close()


@pytest.fixture
def trickler() -> Iterator[Callable[[Callable[[str], tuple[bytes, bytes]]], Trickler]]:
    made: list[Trickler] = []

    def make(respond: Callable[[str], tuple[bytes, bytes]]) -> Trickler:
        made.append(Trickler(respond))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def raises_by_the_deadline(call: Callable[[], object]) -> DeadlineExceeded:
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as exceeded:
        call()
    took = time.monotonic() - started
    assert DEADLINE - 0.05 <= took < DEADLINE + MARGIN, took
    assert isinstance(exceeded.value.__cause__, TimeoutError)
    return exceeded.value


def test_a_job_view_trickled_a_byte_at_a_time_ends_at_the_deadline(trickler) -> None:
    server = trickler(lambda line: (b"", answer("200 OK", "application/json", view())))
    client = Client(server.url, "k", timeout=TIMEOUT, deadline=DEADLINE)
    exceeded = raises_by_the_deadline(lambda: client.job(JOB))
    assert "(1 tries" in str(exceeded)  # the deadline passed during the first try: none after it
    assert server.requests == [f"GET /v1/jobs/{JOB} HTTP/1.1"]


def test_a_download_whose_bytes_trickle_ends_at_the_deadline_and_leaves_nothing(trickler, tmp_path: Path) -> None:
    """The view comes at once, the output's head too; its body trickles (260 bytes: 21 s)."""
    def respond(line: str) -> tuple[bytes, bytes]:
        if "/outputs/" in line:
            whole = answer("200 OK", "image/png", OUTPUT)
            return whole[:-len(OUTPUT)], OUTPUT
        return answer("200 OK", "application/json", view()), b""

    server = trickler(respond)
    client = Client(server.url, "k", timeout=TIMEOUT, deadline=DEADLINE)
    raises_by_the_deadline(lambda: client.download(JOB, 0, tmp_path / "out.png"))
    assert server.requests == [f"GET /v1/jobs/{JOB} HTTP/1.1", f"GET /v1/jobs/{JOB}/outputs/0 HTTP/1.1"]
    assert list(tmp_path.iterdir()) == []  # neither the destination nor a temporary file


def test_an_event_stream_trickled_a_byte_at_a_time_ends_at_the_deadline(trickler) -> None:
    stream = b"retry: 1000\n\nid: 1\nevent: state\ndata: " + json.dumps({"seq": 1, "type": "state"}).encode() + b"\n\n"
    server = trickler(lambda line: (b"", answer("200 OK", "text/event-stream", stream, length=False)))
    client = Client(server.url, "k", timeout=TIMEOUT, deadline=DEADLINE)
    raises_by_the_deadline(lambda: next(client.events(JOB)))
    assert server.requests == [f"GET /v1/jobs/{JOB}/events/stream?after=0 HTTP/1.1"]


def test_a_stream_that_broke_after_outlasting_the_deadline_is_reopened(trickler) -> None:
    """The first stream gives event 1 at once, then a comment line every 0.32 s for 3.2 s (longer than the
    2 s deadline) and is reset; the deadline counts from that failure, so the client opens it again (it used
    to count from when the broken stream opened, and gave up without a second try) and gets event 2."""
    def event(seq: int, to: str) -> bytes:
        data = json.dumps({"seq": seq, "type": "state", "to": to}).encode()
        return b"retry: 10\n\nid: %d\nevent: state\ndata: %s\n\n" % (seq, data)

    def respond(line: str) -> tuple[bytes, bytes]:
        if "after=0" in line:
            return answer("200 OK", "text/event-stream", event(1, "running"), length=False), b": p\n" * 10
        server.reset = False
        return answer("200 OK", "text/event-stream", event(2, "completed"), length=False), b""

    server = trickler(respond)
    server.reset = True
    client = Client(server.url, "k", timeout=TIMEOUT, deadline=DEADLINE)
    assert [e["seq"] for e in client.events(JOB)] == [1, 2]
    assert server.requests == [f"GET /v1/jobs/{JOB}/events/stream?after=0 HTTP/1.1",
                               f"GET /v1/jobs/{JOB}/events/stream?after=1 HTTP/1.1"]
