"""A webhook receiver for the benchmarks: on loopback, in the benchmark's own process, answering 200."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson


class Receiver:
    """A webhook receiver on loopback that answers 200 and counts what it got."""

    def __init__(self) -> None:
        counted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                counted.count += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.count = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def register(self, web_port: int, api_key: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", web_port, timeout=10)
        url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        conn.request("POST", "/v1/webhooks", orjson.dumps({"url": url, "types": ["job.completed"]}),
                     {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        if status != 201:
            raise RuntimeError(f"webhook endpoint refused: {status}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
