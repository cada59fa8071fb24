"""Adapter for ComfyUI's HTTP API (``server.py``): /prompt, /history, /queue, /view.

ComfyUI accepts a client-chosen ``prompt_id`` but does not deduplicate it, so
reckon never submits one operation id twice: recovery asks by the id first.
The output indices to produce ride in ``extra_data.reckon_outputs``; ComfyUI
keeps extra_data in its history, and the simulated provider honours it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import orjson

from ..errors import Transient
from .base import OperationStatus, OutputRef
from .http import HttpTransport


class ComfyUI:
    name = "comfyui"

    def __init__(self, transport: HttpTransport, *, price_per_output: int) -> None:
        self.transport = transport
        self.price_per_output = price_per_output

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int]) -> None:
        payload = {
            "prompt": workflow,
            "prompt_id": operation_id,
            "client_id": "reckon",
            "extra_data": {"reckon_outputs": indices},
        }
        self.transport.request("POST", "/prompt", orjson.dumps(payload))

    def status(self, operation_id: str) -> OperationStatus:
        """History, then the queue, then history again: a prompt that finishes between the
        first two reads is in the history by the third, so it is never taken for unknown."""
        entry = self._history(operation_id)
        if entry:
            return _from_history(entry)
        queue = _json_object(self.transport.request("GET", "/queue").body, "queue_running", "queue_pending")
        for state, items in (("running", queue["queue_running"]), ("pending", queue["queue_pending"])):
            if any(isinstance(item, list) and len(item) > 1 and item[1] == operation_id for item in items):
                return OperationStatus(state)
        entry = self._history(operation_id)
        return _from_history(entry) if entry else OperationStatus("unknown")

    def _history(self, operation_id: str) -> dict[str, Any] | None:
        history = _json_object(self.transport.request("GET", f"/history/{quote(operation_id)}").body)
        entry = history.get(operation_id)
        if entry is not None and not isinstance(entry, dict):
            raise Transient("provider_answer_malformed")
        return entry

    def epoch(self) -> str:
        """ComfyUI shows no process id; a server that adds ``system.reckon_boot_id`` to
        ``/system_stats`` (the simulated one does) lets reconciliation prove non-execution."""
        stats = _json_object(self.transport.request("GET", "/system_stats").body)
        system = stats.get("system")
        return str(system.get("reckon_boot_id", "")) if isinstance(system, dict) else ""

    def fetch(self, ref: OutputRef) -> bytes:
        query = urlencode({"filename": ref.filename, "subfolder": ref.subfolder, "type": ref.folder_type})
        return self.transport.request("GET", f"/view?{query}").body


def _json_object(body: bytes, *lists: str) -> dict[str, Any]:
    """A JSON object with the given list members, or Transient: an answer we cannot read is
    never taken to mean "no such operation"."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise Transient("provider_answer_malformed") from None
    if not isinstance(value, dict) or any(not isinstance(value.get(name), list) for name in lists):
        raise Transient("provider_answer_malformed")
    return value


def _from_history(entry: dict[str, Any]) -> OperationStatus:
    status = entry.get("status") or {}
    failed = status.get("status_str") == "error"
    if not failed and not status.get("completed", True):
        return OperationStatus("running")
    images = [image for node in (entry.get("outputs") or {}).values() for image in node.get("images", [])]
    prompt = entry.get("prompt") or []
    extra = prompt[3] if len(prompt) > 3 and isinstance(prompt[3], dict) else {}
    indices = extra.get("reckon_outputs") or list(range(len(images)))
    refs = [
        OutputRef(index, image["filename"], image.get("subfolder", ""), image.get("type", "output"))
        for index, image in zip(indices, images, strict=False)  # extra images are not ours
    ]
    if failed:
        return OperationStatus("failed", refs, error="provider_execution_error")
    return OperationStatus("completed", refs)
