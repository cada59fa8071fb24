"""A simulated ComfyUI: the same HTTP API, real PNG outputs, and a charge ledger.

Like ComfyUI it keeps its queue and history in memory and executes one prompt
at a time; unlike ComfyUI it records every execution it charges for, so tests
can prove that nothing was paid for twice (``GET /sim/charges``).

Faults are injected per run, for the next N prompts, with ``POST /sim/faults``
(``{"faults": [{"kind": "rate_limit", "times": 2, "retry_after": 3}]}``) or the
``SIM_FAULTS`` variable (the same JSON list). Kinds:

- ``latency`` (``seconds``): every response is delayed, for ``times`` requests
- ``error_before``: 500, nothing queued
- ``error_after``: the prompt is queued (runs, is charged), then 500
- ``rate_limit`` (``retry_after`` seconds): 429 with Retry-After, nothing queued
- ``policy``: 403, refused on policy, nothing queued
- ``auth``: 401, credentials refused, nothing queued
- ``drop``: the prompt is queued (runs, is charged), the connection closes unanswered
- ``partial`` (``produce``): the prompt produces only its first ``produce`` outputs, then fails
- ``read_error`` (``path``, ``status``): a read (GET) whose path starts with ``path`` (``/history``,
  ``/queue``, ``/view``, ``/system_stats``) answers ``status`` (default 500; 0 closes the connection
  unanswered); nothing changes at the provider
- ``trickle`` (``path``, ``seconds``, ``close``): a read whose path starts with ``path`` sends its body
  one byte every ``seconds`` (default 2), each inside any read timeout; with ``close``, its answer
  says ``Connection: close``

Any fault with ``after`` lets that many matching requests pass before it takes effect.

``POST /queue {"delete": [id]}`` removes pending prompts; ``POST /interrupt {"prompt_id": id}`` stops
that prompt if it is the one running (as ComfyUI v0.3.64 does): it ends ``execution_interrupted``,
with no outputs and no charge.

``POST /sim/restart`` loses queue and history, like a ComfyUI restart; the charge
ledger, the ground truth of what was paid, survives. ``POST /sim/ws-drop`` closes every
websocket (a network cut).

``GET /ws?clientId=ID`` is ComfyUI's websocket: a prompt's messages (``execution_start``,
``executing``, ``progress`` in four steps, ``executed``, then ``execution_success`` or
``execution_error``) go to the sockets of the prompt's ``client_id``.

Run it: ``python -m pipeline.providers.sim --port 8188 --delay 0.5``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import logging
import os
import socket
import struct
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

DEFAULT_PORT = 8188
DEFAULT_PRICE_PER_OUTPUT = 10


def png(seed: str, size: int = 8) -> bytes:
    """A small, valid RGB PNG whose colour and text chunk derive from ``seed``."""
    r, g, b = hashlib.sha256(seed.encode()).digest()[:3]
    rows = b"".join(b"\x00" + bytes((r, g, b)) * size for _ in range(size))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tEXt", b"seed\x00" + seed.encode())
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _frame(opcode: int, payload: bytes) -> bytes:
    """A websocket frame from the server (final, unmasked)."""
    size = len(payload)
    header = bytes([0x80 | opcode, size]) if size < 126 else bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
    return header + payload


def _read_frame(stream: Any) -> tuple[int, bytes]:
    """One websocket frame from a client (masked, as RFC 6455 requires): (opcode, payload)."""
    head = stream.read(2)
    if len(head) < 2:
        raise EOFError
    size = head[1] & 0x7F
    if size >= 126:
        size = int.from_bytes(stream.read(2 if size == 126 else 8), "big")
    mask = stream.read(4)
    data = stream.read(size)
    return head[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class SimComfy:
    """The provider's in-memory state and its single executor thread."""

    def __init__(self, *, delay: float = 0.0, price_per_output: int = DEFAULT_PRICE_PER_OUTPUT) -> None:
        self.delay = delay
        self.price_per_output = price_per_output
        self.cond = threading.Condition()
        self.pending: list[list[Any]] = []
        self.running: list[Any] | None = None
        self.history: dict[str, dict[str, Any]] = {}
        self.files: dict[str, bytes] = {}
        self.charges: list[dict[str, Any]] = []
        self.number = 0
        self.boot_id = uuid.uuid4().hex
        self.faults: list[dict[str, Any]] = []
        self.stopped = False
        self.interrupted = ""
        self.sockets: list[tuple[str, socket.socket]] = []
        self.send_lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name="sim-executor", daemon=True)
        self.thread.start()

    def enqueue(self, payload: dict[str, Any]) -> dict[str, Any]:
        prompt = payload.get("prompt")
        if not isinstance(prompt, dict) or not prompt:
            raise ValueError("prompt_no_outputs")
        with self.cond:
            self.number += 1
            prompt_id = str(payload.get("prompt_id") or hashlib.sha1(str(self.number).encode()).hexdigest())
            extra = dict(payload.get("extra_data") or {})
            extra["client_id"] = str(payload.get("client_id", ""))
            self.pending.append([self.number, prompt_id, prompt, extra, []])
            self.cond.notify_all()
            return {"prompt_id": prompt_id, "number": self.number, "node_errors": {}}

    def take_fault(self, *kinds: str, path: str = "") -> dict[str, Any] | None:
        """The first active fault of one of ``kinds`` (matching ``path`` if it names one), counting one use."""
        with self.cond:
            for fault in self.faults:
                if fault["kind"] in kinds and fault.get("times", 1) > 0 and path.startswith(fault.get("path", "")):
                    if fault.get("after", 0) > 0:  # lets this many matching uses pass first
                        fault["after"] -= 1
                        continue
                    fault["times"] = fault.get("times", 1) - 1
                    return dict(fault)
        return None

    def restart(self) -> None:
        """Lose queue and history (a new process life) and every websocket; keep the charge ledger."""
        with self.cond:
            self.pending.clear()
            self.history.clear()
            self.running = None
            self.boot_id = uuid.uuid4().hex
        self.drop_sockets()

    def drop_sockets(self) -> None:
        with self.send_lock:
            for _, sock in self.sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # close() alone leaves a reader thread's connection open
                except OSError:
                    pass
            self.sockets.clear()

    def send(self, client_id: str, kind: str, data: dict[str, Any]) -> None:
        """One websocket message to the sockets of ``client_id``."""
        frame = _frame(0x1, orjson.dumps({"type": kind, "data": data}))
        with self.send_lock:
            for owner, sock in list(self.sockets):
                if owner == client_id:
                    try:
                        sock.sendall(frame)
                    except OSError:
                        self.sockets.remove((owner, sock))

    def pong(self, sock: socket.socket, payload: bytes) -> None:
        with self.send_lock:
            sock.sendall(_frame(0xA, payload))

    def queue(self) -> dict[str, Any]:
        with self.cond:
            return {"queue_running": [self.running] if self.running else [], "queue_pending": list(self.pending)}

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=5)

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    return
                self.running = self.pending.pop(0)
            item = self.running
            self._progress(item)
            with self.cond:
                if self.running is not None:  # None: a restart lost it mid-execution
                    self._execute(self.running)
                self.running = None
            if item is not None and item[1] in self.history:
                self._announce_end(item)

    def _progress(self, item: list[Any]) -> None:
        """What ComfyUI says while a prompt runs; the prompt takes ``delay`` seconds in four steps."""
        client, prompt_id = item[3].get("client_id", ""), item[1]
        self.send(client, "execution_start", {"prompt_id": prompt_id})
        self.send(client, "executing", {"node": "9", "display_node": "9", "prompt_id": prompt_id})
        for step in range(1, 5):
            time.sleep(self.delay / 4)
            if self.interrupted == prompt_id:
                return
            self.send(client, "progress", {"value": step, "max": 4, "prompt_id": prompt_id, "node": "9"})

    def _announce_end(self, item: list[Any]) -> None:
        client, prompt_id = item[3].get("client_id", ""), item[1]
        entry = self.history[prompt_id]
        if "9" in entry["outputs"]:
            self.send(client, "executed", {"node": "9", "output": entry["outputs"]["9"], "prompt_id": prompt_id})
        if self.interrupted == prompt_id:
            self.send(client, "execution_interrupted", {"prompt_id": prompt_id})
        elif entry["status"]["status_str"] == "error":
            self.send(client, "execution_error", {"prompt_id": prompt_id, "node_id": "9", "node_type": "SaveImage",
                                                  "exception_type": "sim.Partial", "exception_message": "partial"})
        else:
            self.send(client, "execution_success", {"prompt_id": prompt_id})
        self.send(client, "executing", {"node": None, "prompt_id": prompt_id})

    def _execute(self, item: list[Any]) -> None:
        number, prompt_id, _prompt, extra, _ = item
        if self.interrupted == prompt_id:
            stop = {"prompt_id": prompt_id, "node_id": "9", "node_type": "SaveImage", "executed": []}
            self.history[prompt_id] = {"prompt": item, "outputs": {}, "status": {
                "status_str": "error", "completed": False, "messages": [["execution_interrupted", stop]]}}
            return
        indices = extra.get("reckon_outputs") or [0]
        produce = extra.get("_sim_produce")
        failed = produce is not None and produce < len(indices)
        indices = indices[:produce] if failed else indices
        images = []
        for index in indices:
            filename = f"reckon_{prompt_id}_{index}_{number}.png"
            self.files[filename] = png(f"{prompt_id}:{index}:{number}")
            images.append({"filename": filename, "subfolder": "", "type": "output"})
        self.history[prompt_id] = {
            "prompt": item,
            "outputs": {"9": {"images": images}},
            "status": {"status_str": "error" if failed else "success", "completed": not failed, "messages": []},
        }
        self.charges.append(
            {"prompt_id": prompt_id, "outputs": len(indices), "units": len(indices) * self.price_per_output}
        )


class Handler(BaseHTTPRequestHandler):
    server: SimServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - never log prompts
        pass

    def _send(self, status: int, body: Any, content_type: str = "application/json", every: float = 0.0) -> None:
        """The answer; with ``every``, its body one byte every ``every`` seconds (the ``trickle`` fault)."""
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not every:
            self.wfile.write(data)
            return
        for offset in range(len(data)):  # until the client gives up (a broken pipe ends the handler)
            time.sleep(every)
            self.wfile.write(data[offset:offset + 1])

    def _delay(self) -> None:
        fault = self.server.sim.take_fault("latency")
        if fault:
            time.sleep(float(fault.get("seconds", 1.0)))

    def _read_fault(self, path: str) -> bool:
        """Answer a faulty read if a ``read_error`` fault matches ``path``; True if it did."""
        fault = self.server.sim.take_fault("read_error", path=path)
        if fault is None:
            return False
        status = int(fault.get("status", 500))
        if status == 0:
            self.close_connection = True
            self.connection.shutdown(2)
        else:
            self._send(status, {"error": "sim_read_error"})
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._delay()
        sim, url = self.server.sim, urlsplit(self.path)
        if not url.path.startswith("/sim/") and self._read_fault(url.path):
            return None
        if url.path == "/ws":
            return self._websocket(sim, parse_qs(url.query).get("clientId", [""])[0])
        if url.path == "/system_stats":
            return self._send(200, {"system": {"os": "posix", "comfyui_version": "sim", "reckon_boot_id": sim.boot_id},
                                    "devices": []})
        if url.path == "/sim/faults":
            with sim.cond:
                return self._send(200, {"faults": sim.faults})
        if url.path == "/queue":
            return self._send(200, sim.queue())
        if url.path.startswith("/history/"):
            prompt_id = url.path.removeprefix("/history/")
            with sim.cond:
                entry = sim.history.get(prompt_id)
            return self._send(200, {prompt_id: entry} if entry else {})
        if url.path == "/view":
            name = parse_qs(url.query).get("filename", [""])[0]
            data, trickle = sim.files.get(name), sim.take_fault("trickle", path=url.path)
            every = float(trickle.get("seconds", 2.0)) if trickle else 0.0
            if trickle and trickle.get("close"):
                self.close_connection = True
            return self._send(200, data, "image/png", every) if data else self._send(404, {"error": "not_found"})
        if url.path == "/sim/charges":
            with sim.cond:
                charges = list(sim.charges)
            return self._send(200, {"charges": charges, "total_units": sum(c["units"] for c in charges)})
        return self._send(404, {"error": "not_found"})

    def _websocket(self, sim: SimComfy, client_id: str) -> None:
        """Accept a websocket (RFC 6455 handshake), greet like ComfyUI, and hold the
        connection until the client closes it; messages go out from ``SimComfy.send``."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        with sim.send_lock:
            sim.sockets.append((client_id, self.connection))
        sim.send(client_id, "status", {"status": {"exec_info": {"queue_remaining": len(sim.pending)}},
                                       "sid": client_id})
        try:
            while True:  # the client's frames: a ping gets its pong, a close (or EOF) ends it
                opcode, payload = _read_frame(self.rfile)
                if opcode == 0x9:
                    sim.pong(self.connection, payload)
                elif opcode == 0x8:
                    break
        except (OSError, EOFError):
            pass
        with sim.send_lock:
            if (client_id, self.connection) in sim.sockets:
                sim.sockets.remove((client_id, self.connection))

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        sim, path = self.server.sim, urlsplit(self.path).path
        if path == "/sim/faults":
            with sim.cond:
                sim.faults = list(orjson.loads(body).get("faults", []))
            return self._send(200, {"faults": sim.faults})
        if path == "/sim/restart":
            sim.restart()
            return self._send(200, {"boot_id": sim.boot_id})
        if path == "/sim/ws-drop":
            sim.drop_sockets()
            return self._send(200, {"dropped": True})
        if path in ("/queue", "/interrupt"):
            return self._control(sim, path, orjson.loads(body or b"{}"))
        if path != "/prompt":
            return self._send(404, {"error": "not_found"})
        self._delay()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        self._prompt(sim, payload)

    def _control(self, sim: SimComfy, path: str, payload: dict[str, Any]) -> None:
        with sim.cond:
            if path == "/queue":
                gone = set(payload.get("delete", []))
                sim.pending = [item for item in sim.pending if item[1] not in gone]
            elif sim.running is not None and sim.running[1] == payload.get("prompt_id"):
                sim.interrupted = sim.running[1]
        return self._send(200, {})

    def _prompt(self, sim: SimComfy, payload: Any) -> None:
        refusal = sim.take_fault("error_before", "rate_limit", "policy", "auth")
        if refusal:
            return self._refuse(refusal)
        partial = sim.take_fault("partial")  # combines with the answer faults below
        if partial and isinstance(payload, dict):
            payload.setdefault("extra_data", {})["_sim_produce"] = int(partial.get("produce", 0))
        accepted = sim.take_fault("error_after", "drop")
        try:
            answer = sim.enqueue(payload if isinstance(payload, dict) else {})
        except ValueError as exc:
            error = {"type": str(exc), "message": "Prompt has no outputs", "details": "", "extra_info": {}}
            return self._send(400, {"error": error, "node_errors": {}})
        if accepted and accepted["kind"] == "drop":
            self.close_connection = True
            self.connection.shutdown(2)  # the prompt runs and is charged; the client never hears
            return None
        if accepted and accepted["kind"] == "error_after":
            return self._send(500, {"error": "internal_error"})
        return self._send(200, answer)

    def _refuse(self, fault: dict[str, Any]) -> None:
        kind = fault["kind"]
        if kind == "rate_limit":
            data = orjson.dumps({"error": "rate_limited"})
            self.send_response(429)
            self.send_header("Retry-After", str(fault.get("retry_after", 1)))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return None
        status = {"error_before": 500, "policy": 403, "auth": 401}[kind]
        return self._send(status, {"error": {"type": kind}})


class SimServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], sim: SimComfy) -> None:
        super().__init__(address, Handler)
        self.sim = sim

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a dropped connection (the `drop` fault) is not news

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.sim.stop()


def start(host: str = "127.0.0.1", port: int = 0, **options: Any) -> SimServer:
    """Start a simulated provider in a background thread (port 0: any free port)."""
    server = SimServer((host, port), SimComfy(**options))
    threading.Thread(target=server.serve_forever, name="sim-http", daemon=True).start()
    return server


def main() -> None:
    from pipeline.logs import configure

    configure("sim")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds each prompt takes")
    parser.add_argument("--price", type=int, default=DEFAULT_PRICE_PER_OUTPUT, help="cost units per output")
    args = parser.parse_args()
    server = SimServer((args.host, args.port), SimComfy(delay=args.delay, price_per_output=args.price))
    server.sim.faults = orjson.loads(os.environ.get("SIM_FAULTS", "[]"))
    logging.getLogger(__name__).info("simulated ComfyUI on %s", server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
