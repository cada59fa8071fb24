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
        queue = orjson.loads(self.transport.request("GET", "/queue").body)
        for state, items in (("running", queue.get("queue_running", [])), ("pending", queue.get("queue_pending", []))):
            if any(len(item) > 1 and item[1] == operation_id for item in items):
                return OperationStatus(state)
        entry = self._history(operation_id)
        return _from_history(entry) if entry else OperationStatus("unknown")

    def _history(self, operation_id: str) -> dict[str, Any] | None:
        history = orjson.loads(self.transport.request("GET", f"/history/{quote(operation_id)}").body)
        return history.get(operation_id)

    def epoch(self) -> str:
        """ComfyUI shows no process id; a server that adds ``system.reckon_boot_id`` to
        ``/system_stats`` (the simulated one does) lets reconciliation prove non-execution."""
        stats = orjson.loads(self.transport.request("GET", "/system_stats").body)
        return str((stats.get("system") or {}).get("reckon_boot_id", ""))

    def fetch(self, ref: OutputRef) -> bytes:
        query = urlencode({"filename": ref.filename, "subfolder": ref.subfolder, "type": ref.folder_type})
        return self.transport.request("GET", f"/view?{query}").body


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
