"""A simulated ComfyUI: the same HTTP API, real PNG outputs, and a charge ledger.

Like ComfyUI it keeps its queue and history in memory and executes one prompt
at a time; unlike ComfyUI it records every execution it charges for, so tests
can prove that nothing was paid for twice (``GET /sim/charges``).

Faults are injected per run (pipeline/providers/sim/faults.py lists the kinds).

``POST /queue {"delete": [id]}`` removes pending prompts; ``POST /interrupt {"prompt_id": id}`` stops
that prompt if it is the one running (as ComfyUI v0.3.64 does): it ends ``execution_interrupted``,
with no outputs and no charge.

``POST /sim/restart`` loses queue and history, like a ComfyUI restart; the charge
ledger, the ground truth of what was paid, survives, and so does its input folder unless the body
says ``{"wipe_inputs": true}``. ``POST /sim/ws-drop`` closes every websocket (a network cut).

Its input folder (``POST /upload/image``, ``HEAD``/``GET /view?type=input``, the refusal of a prompt
naming a missing input) is pipeline/providers/sim/uploads.py; ``GET /sim/inputs`` lists the files
it holds (name -> size) and how many uploads it took.

The websocket is pipeline/providers/sim/websocket.py.

Run it: ``python -m pipeline.providers.sim --port 8188 --delay 0.5``.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from pipeline.providers.sim.uploads import missing_input_refusal, parse_form, store_upload
from pipeline.providers.sim.comfy import SimComfy
from pipeline.providers.sim.websocket import serve_websocket

DEFAULT_PORT = 8188
DEFAULT_PRICE_PER_OUTPUT = 10


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
        fault = self.server.sim.faults.take("latency")
        if fault:
            time.sleep(float(fault.get("seconds", 1.0)))

    def _read_fault(self, path: str) -> bool:
        """Answer a faulty read if a ``read_error`` fault matches ``path``; True if it did."""
        fault = self.server.sim.faults.take("read_error", path=path)
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
            return serve_websocket(self, sim, parse_qs(url.query).get("clientId", [""])[0])
        if url.path == "/system_stats":
            return self._send(200, {"system": {"os": "posix", "comfyui_version": "sim", "reckon_boot_id": sim.boot_id},
                                    "devices": []})
        if url.path == "/sim/faults":
            with sim.cond:
                return self._send(200, {"faults": sim.faults.listing()})
        if url.path == "/queue":
            return self._send(200, sim.queue())
        if url.path == "/object_info" and sim.nodes is not None:
            return self._send(200, {name: {"input": {}} for name in sim.nodes})
        if url.path == "/models" and sim.nodes is not None:
            return self._send(200, sorted(sim.models or {}))
        if url.path.startswith("/models/") and sim.nodes is not None:
            return self._send(200, sorted((sim.models or {}).get(url.path.removeprefix("/models/"), [])))
        if url.path.startswith("/history/"):
            prompt_id = url.path.removeprefix("/history/")
            with sim.cond:
                entry = sim.history.get(prompt_id)
            return self._send(200, {prompt_id: entry} if entry else {})
        if url.path == "/view" and parse_qs(url.query).get("type") == ["input"]:
            data = self._input(url.query)
            return self._send(200, data, "application/octet-stream") if data is not None else self._send(404, {})
        if url.path == "/sim/inputs":
            with sim.cond:
                files = {name: len(data) for name, data in sim.inputs.items()}
            return self._send(200, {"files": files, "uploads": sim.uploads})
        if url.path == "/view":
            name = parse_qs(url.query).get("filename", [""])[0]
            data, trickle = sim.files.get(name), sim.faults.take("trickle", path=url.path)
            every = float(trickle.get("seconds", 2.0)) if trickle else 0.0
            if trickle and trickle.get("close"):
                self.close_connection = True
            return self._send(200, data, "image/png", every) if data else self._send(404, {"error": "not_found"})
        if url.path == "/sim/charges":
            with sim.cond:
                charges = list(sim.charges)
            return self._send(200, {"charges": charges, "total_units": sum(c["units"] for c in charges)})
        return self._send(404, {"error": "not_found"})

    def _input(self, query: str) -> bytes | None:
        """The input folder's file ``/view?filename=..&subfolder=..&type=input`` names, or None."""
        asked = parse_qs(query)
        name = asked.get("filename", [""])[0]
        subfolder = asked.get("subfolder", [""])[0]
        with self.server.sim.cond:
            return self.server.sim.inputs.get(f"{subfolder}/{name}" if subfolder else name)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming; as aiohttp, a GET without its body
        url = urlsplit(self.path)
        if self._read_fault(url.path):
            return
        data = self._input(url.query) if url.path == "/view" else None
        self.send_response(200 if data is not None else 404)
        self.send_header("Content-Length", str(len(data) if data is not None else 0))
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        sim, path = self.server.sim, urlsplit(self.path).path
        if path == "/sim/faults":
            with sim.cond:
                sim.faults.set(list(orjson.loads(body).get("faults", [])))
            return self._send(200, {"faults": sim.faults.listing()})
        if path == "/sim/restart":
            sim.restart(wipe_inputs=bool(orjson.loads(body or b"{}").get("wipe_inputs")))
            return self._send(200, {"boot_id": sim.boot_id})
        if path == "/sim/ws-drop":
            sim.drop_sockets()
            return self._send(200, {"dropped": True})
        if path in ("/queue", "/interrupt"):
            return self._control(sim, path, orjson.loads(body or b"{}"))
        if path == "/upload/image":
            return self._upload(sim, body)
        if path != "/prompt":
            return self._send(404, {"error": "not_found"})
        self._delay()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        self._prompt(sim, payload)

    def _upload(self, sim: SimComfy, body: bytes) -> None:
        fault = sim.faults.take("upload_error")
        if fault:
            return self._send(int(fault.get("status", 500)), {"error": "sim_upload_error"})
        try:
            fields = parse_form(self.headers.get("Content-Type", ""), body)
        except ValueError:
            return self._send(400, b"")
        with sim.cond:
            status, answer = store_upload(sim.inputs, fields)
            sim.uploads += int(status == 200)
        return self._send(status, answer)

    def _control(self, sim: SimComfy, path: str, payload: dict[str, Any]) -> None:
        fault = sim.faults.take("control_error")
        if fault:
            return self._send(int(fault.get("status", 500)), {"error": "sim_control_error"})
        with sim.cond:
            if path == "/queue":
                gone = set(payload.get("delete", []))
                sim.pending = [item for item in sim.pending if item[1] not in gone]
            elif sim.running is not None and sim.running[1] == payload.get("prompt_id"):
                sim.interrupted = sim.running[1]
        return self._send(200, {})

    def _prompt(self, sim: SimComfy, payload: Any) -> None:
        refusal = sim.faults.take("error_before", "rate_limit", "policy", "auth")
        if refusal:
            return self._refuse(refusal)
        partial = sim.faults.take("partial")  # combines with the answer faults below
        if partial and isinstance(payload, dict):
            payload.setdefault("extra_data", {})["_sim_produce"] = int(partial.get("produce", 0))
        if sim.faults.take("lose_inputs"):  # its input folder emptied between a check and this prompt
            with sim.cond:
                sim.inputs.clear()
        refused = missing_input_refusal(sim.inputs, payload.get("prompt") or {}) if isinstance(payload, dict) else None
        if refused:
            return self._send(400, refused)
        accepted = sim.faults.take("error_after", "drop")
        try:
            answer = sim.enqueue(payload if isinstance(payload, dict) else {})
        except ValueError as exc:
            message = "Prompt has no outputs" if str(exc) == "prompt_no_outputs" else "Prompt refused"
            error = {"type": str(exc), "message": message, "details": "", "extra_info": {}}
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
    server.sim.faults.set(orjson.loads(os.environ.get("SIM_FAULTS", "[]")))
    logging.getLogger(__name__).info("simulated ComfyUI on %s", server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
