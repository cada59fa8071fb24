"""The simulated ComfyUI's websocket (``GET /ws?clientId=ID``), as ComfyUI's: a prompt's messages
(``execution_start``, ``executing``, ``progress`` in four steps, ``executed``, then
``execution_success`` or ``execution_error``) go to the sockets of the prompt's ``client_id``.
``POST /sim/ws-drop`` closes every websocket (a network cut)."""

from __future__ import annotations

import base64
import hashlib
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol


class Clients(Protocol):
    """What a websocket needs of the simulator: its sockets, and how it greets and answers."""

    send_lock: threading.Lock
    sockets: list[tuple[str, socket.socket]]
    pending: list[list[Any]]

    def send(self, client_id: str, kind: str, data: dict[str, Any]) -> None: ...

    def pong(self, sock: socket.socket, payload: bytes) -> None: ...


def frame(opcode: int, payload: bytes) -> bytes:
    """A websocket frame from the server (final, unmasked)."""
    size = len(payload)
    header = bytes([0x80 | opcode, size]) if size < 126 else bytes([0x80 | opcode, 126]) + struct.pack(">H", size)
    return header + payload


def read_frame(stream: Any) -> tuple[int, bytes]:
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


def serve_websocket(handler: BaseHTTPRequestHandler, sim: Clients, client_id: str) -> None:
    """Accept a websocket (RFC 6455 handshake), greet like ComfyUI, and hold the
    connection until the client closes it; messages go out from ``SimComfy.send``."""
    key = handler.headers.get("Sec-WebSocket-Key", "")
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    handler.send_response(101)
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept.decode())
    handler.end_headers()
    handler.wfile.flush()
    handler.close_connection = True
    with sim.send_lock:
        sim.sockets.append((client_id, handler.connection))
    sim.send(client_id, "status", {"status": {"exec_info": {"queue_remaining": len(sim.pending)}},
                                   "sid": client_id})
    try:
        while True:  # the client's frames: a ping gets its pong, a close (or EOF) ends it
            opcode, payload = read_frame(handler.rfile)
            if opcode == 0x9:
                sim.pong(handler.connection, payload)
            elif opcode == 0x8:
                break
    except (OSError, EOFError):
        pass
    with sim.send_lock:
        if (client_id, handler.connection) in sim.sockets:
            sim.sockets.remove((client_id, handler.connection))
