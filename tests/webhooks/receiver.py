"""A webhook receiver for tests, run as its own process: it records every request it gets (time, headers,
body, and what it answered) as one JSON line, and answers by a plan a test sets over HTTP.

``python tests/webhooks/receiver.py PORT LOG`` serves 127.0.0.1:PORT. ``POST /_plan`` with a JSON list of
answers sets the next ones (then ``ok`` for the rest): ``ok`` (200), ``500``, ``429:N`` (429 with
``Retry-After: N``), ``timeout`` (answers 200 only after 3 s), ``drop`` (closes the connection unanswered),
``307:URL`` (a redirect), ``big`` (200 with a 10 MB body), ``drip`` (its answer a byte every 0.2 s),
``hold`` (answers 200 only once ``POST /_release`` was made: a hanging endpoint that a test lets go).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PLAN: list[str] = []
LOCK = threading.Lock()
RELEASED = threading.Event()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the benchmark's receiver (ops/bench/deployed.py) answers HTTP/1.0

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/_plan":
            with LOCK:
                PLAN[:] = json.loads(body)
            return self._answer(200, b"{}")
        if self.path == "/_release":
            RELEASED.set()
            return self._answer(200, b"{}")
        with LOCK:
            answer = PLAN.pop(0) if PLAN else "ok"
        with open(self.server.log_path, "a") as log:  # type: ignore[attr-defined]
            log.write(json.dumps({"at": time.time(), "path": self.path, "answer": answer,
                                  "headers": {k.lower(): v for k, v in self.headers.items()},
                                  "body": body.decode()}) + "\n")
        if answer == "ok":
            self._answer(200, b"ok")
        elif answer == "500":
            self._answer(500, b"boom")
        elif answer.startswith("429:"):
            self._answer(429, b"slow down", {"Retry-After": answer[4:]})
        elif answer == "timeout":
            time.sleep(3)
            self._answer(200, b"late")
        elif answer == "hold":
            RELEASED.wait()
            self._answer(200, b"held")
        elif answer == "drop":
            self.close_connection = True
            self.connection.close()
        elif answer.startswith("307:"):
            self._answer(307, b"", {"Location": answer[4:]})
        elif answer == "drip":  # the status line a byte every 0.2 s, never finished
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 100:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        elif answer == "big":
            self._answer(200, b"x" * 10_000_000)

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass


def main() -> None:
    port, log_path = int(sys.argv[1]), sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.log_path = log_path  # type: ignore[attr-defined]
    server.serve_forever()


if __name__ == "__main__":
    main()
