"""The simulated ComfyUI's state: its queue, history and files in memory, one executor thread, and
the ledger of every execution it charged for (the ground truth tests compare reckon's books with)."""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
import time
import uuid
import zlib
from typing import Any

import orjson

from pipeline.fleet import seconds_units
from pipeline.needs import Offer, missing, needs_of
from pipeline.providers.sim.faults import Faults
from pipeline.providers.sim.websocket import frame

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


class SimComfy:
    """The provider's in-memory state and its single executor thread."""

    def __init__(self, *, delay: float = 0.0, price_per_output: int = DEFAULT_PRICE_PER_OUTPUT,
                 nodes: list[str] | None = None, models: dict[str, list[str]] | None = None,
                 load_seconds: float = 0.0, graph_outputs: int | None = None, price_per_second: int = 0,
                 cache: bool = False) -> None:
        """``nodes``, ``models``: what it offers (``/object_info``, ``/models/<folder>``), and refuses a
        prompt naming anything else as ComfyUI does (400); None: no ``/object_info`` (404), runs
        anything. ``load_seconds``: what loading another checkpoint than the last one costs.
        ``graph_outputs``: every prompt makes (and is charged) this many images whatever its
        ``reckon_outputs`` ask for, as ComfyUI does: it runs the whole graph each time; None: only
        the indices asked for. ``price_per_second``: charged per second of execution (its own
        ``execution_start`` to end timestamps, ms, rounded up to the unit), interrupted runs too.
        ``cache``: a graph run before executes nothing again (no delay), as ComfyUI's cache does."""
        self.delay = delay
        self.price_per_output, self.price_per_second, self.cache = price_per_output, price_per_second, cache
        self.executed: set[str] = set()  # digests of the graphs run (``cache``)
        self.nodes, self.models, self.load_seconds = nodes, models, load_seconds
        self.graph_outputs = graph_outputs
        #: The checkpoint in memory, and how many times one was loaded.
        self.loaded, self.loads = "", 0
        self.cond = threading.Condition()
        self.pending: list[list[Any]] = []
        self.running: list[Any] | None = None
        self.history: dict[str, dict[str, Any]] = {}
        self.files: dict[str, bytes] = {}
        #: Its input folder (pipeline/providers/sim/uploads.py): name under the folder -> bytes.
        self.inputs: dict[str, bytes] = {}
        #: Uploads stored since it started (duplicates and replacements included).
        self.uploads = 0
        self.charges: list[dict[str, Any]] = []
        self.number = 0
        self.boot_id = uuid.uuid4().hex
        self._faults = Faults(self.cond)
        self.stopped = False
        self.interrupted = ""
        self.sockets: list[tuple[str, socket.socket]] = []
        self.send_lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name="sim-executor", daemon=True)
        self.thread.start()

    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: list[dict[str, Any]]) -> None:
        """The faults of the next requests, as ``POST /sim/faults`` sets them (tests set them here)."""
        self._faults.set(faults)

    def enqueue(self, payload: dict[str, Any]) -> dict[str, Any]:
        prompt = payload.get("prompt")
        if not isinstance(prompt, dict) or not prompt:
            raise ValueError("prompt_no_outputs")
        lacking = missing(needs_of(prompt), self.offer())
        if lacking:
            raise ValueError("invalid_prompt" if lacking.nodes else "prompt_outputs_failed_validation")
        with self.cond:
            self.number += 1
            prompt_id = str(payload.get("prompt_id") or hashlib.sha1(str(self.number).encode()).hexdigest())
            extra = dict(payload.get("extra_data") or {})
            extra["client_id"] = str(payload.get("client_id", ""))
            self.pending.append([self.number, prompt_id, prompt, extra, []])
            self.cond.notify_all()
            return {"prompt_id": prompt_id, "number": self.number, "node_errors": {}}

    def offer(self) -> Offer | None:
        if self.nodes is None:
            return None
        return Offer(frozenset(self.nodes), {k: frozenset(v) for k, v in (self.models or {}).items()})

    def _load(self, prompt: dict[str, Any]) -> None:
        """Load the prompt's checkpoint unless it is the one in memory (``load_seconds``)."""
        checkpoint = needs_of(prompt).checkpoint
        if checkpoint and checkpoint != self.loaded:
            time.sleep(self.load_seconds)
            self.loaded, self.loads = checkpoint, self.loads + 1

    def restart(self, *, wipe_inputs: bool = False) -> None:
        """Lose queue and history (a new process life) and every websocket; keep the charge ledger, and
        the input folder unless ``wipe_inputs``."""
        with self.cond:
            if wipe_inputs:
                self.inputs.clear()
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
        message = frame(0x1, orjson.dumps({"type": kind, "data": data}))
        with self.send_lock:
            for owner, sock in list(self.sockets):
                if owner == client_id:
                    try:
                        sock.sendall(message)
                    except OSError:
                        self.sockets.remove((owner, sock))

    def pong(self, sock: socket.socket, payload: bytes) -> None:
        with self.send_lock:
            sock.sendall(frame(0xA, payload))

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
            started = int(time.time() * 1000)
            self._load(item[2])
            self._progress(item)
            with self.cond:
                if self.running is not None:  # None: a restart lost it mid-execution
                    self._execute(self.running, started)
                self.running = None
            if item is not None and item[1] in self.history:
                self._announce_end(item)

    def _progress(self, item: list[Any]) -> None:
        """What ComfyUI says while a prompt runs; the prompt takes ``delay`` seconds in four steps."""
        client, prompt_id = item[3].get("client_id", ""), item[1]
        self.send(client, "execution_start", {"prompt_id": prompt_id, "timestamp": int(time.time() * 1000)})
        digest = hashlib.sha256(orjson.dumps(item[2], option=orjson.OPT_SORT_KEYS)).hexdigest()
        if self.cache and digest in self.executed:  # every node cached: nothing runs
            self.send(client, "execution_cached", {"nodes": ["9"], "prompt_id": prompt_id})
            return
        self.executed.add(digest)
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

    def _execute(self, item: list[Any], started: int) -> None:
        number, prompt_id, _prompt, extra, _ = item
        ended = int(time.time() * 1000)
        start = ["execution_start", {"prompt_id": prompt_id, "timestamp": started}]
        if self.interrupted == prompt_id:
            stop = {"prompt_id": prompt_id, "node_id": "9", "node_type": "SaveImage", "executed": [],
                    "timestamp": ended}
            self.history[prompt_id] = {"prompt": item, "outputs": {}, "status": {
                "status_str": "error", "completed": False, "messages": [start, ["execution_interrupted", stop]]}}
            if self.price_per_second:  # the seconds it ran are billed
                self._charge(prompt_id, 0, ended - started)
            return
        indices = extra.get("reckon_outputs") or [0]
        if self.graph_outputs is not None:  # ComfyUI: the whole graph, whatever was asked for
            indices = list(range(self.graph_outputs))
        produce = extra.get("_sim_produce")
        failed = produce is not None and produce < len(indices)
        indices = indices[:produce] if failed else indices
        images = []
        for index in indices:
            filename = f"reckon_{prompt_id}_{index}_{number}.png"
            self.files[filename] = png(f"{prompt_id}:{index}:{number}")
            images.append({"filename": filename, "subfolder": "", "type": "output"})
        # a partial run's history names no end message: its error stays one "with no evidence it would fail
        # again" (retried), as before timestamps; its seconds are then unread (booked at the bound)
        end = [] if failed else [["execution_success", {"prompt_id": prompt_id, "timestamp": ended}]]
        self.history[prompt_id] = {
            "prompt": item,
            "outputs": {"9": {"images": images}},
            "status": {"status_str": "error" if failed else "success", "completed": not failed,
                       "messages": [start, *end]},
        }
        self._charge(prompt_id, len(indices), ended - started)

    def _charge(self, prompt_id: str, outputs: int, ms: int) -> None:
        """One execution in the charge ledger: its outputs at the price per output, its milliseconds
        (``ms``, per its own timestamps) at the price per second, rounded up to the unit."""
        units = outputs * self.price_per_output + seconds_units(ms, self.price_per_second)
        self.charges.append({"prompt_id": prompt_id, "outputs": outputs, "ms": ms, "units": units})
