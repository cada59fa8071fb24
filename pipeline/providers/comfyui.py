"""Adapter for ComfyUI's HTTP API (``server.py``, v0.3.64): /prompt, /history, /queue, /interrupt, /view,
/upload/image.

ComfyUI accepts a client-chosen ``prompt_id`` but does not deduplicate it, so
reckon never submits one operation id twice: recovery asks by the id first.
The output indices to produce ride in ``extra_data.reckon_outputs``: ComfyUI
ignores them (a graph makes what it makes; comfyui_answers maps its images onto
the indices) but keeps them in its history, and the simulated provider honours
them.

Every prompt is sent with one ``client_id`` (``DEFAULT_CLIENT_ID``): ComfyUI sends
a prompt's websocket messages only to the socket whose ``clientId`` is the
prompt's ``client_id`` (``execution_interrupted`` and ``status`` go to all), so a
watcher of this server connects with the same id, once per server (a second
socket with the same id takes the first one's messages).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import orjson

from pipeline.errors import InvalidInput, OutputLost, Transient, UnknownOutcome
from pipeline.inputs import SUBFOLDER
from pipeline.needs import FOLDERS, Offer
from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.providers.comfyui_answers import SAFE_REASON, from_history, node_error_detail, prompt_error_detail
from pipeline.providers.http import HttpTransport, multipart
from pipeline.settings import DEFAULT_OUTPUT_FETCH_SECONDS

#: The ``client_id`` reckon's prompts carry; a websocket watcher connects as ``/ws?clientId=`` this.
DEFAULT_CLIENT_ID = "reckon"


class ComfyUI:
    name = "comfyui"

    def __init__(self, transport: HttpTransport, *, price_per_output: int,
                 client_id: str = DEFAULT_CLIENT_ID, fetch_seconds: float = DEFAULT_OUTPUT_FETCH_SECONDS) -> None:
        """``fetch_seconds``: the longest one output's download may take in all."""
        self.transport = transport
        self.price_per_output = price_per_output
        self.client_id = client_id
        self.fetch_seconds = fetch_seconds

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int], *,
               front: bool = False) -> dict[str, str] | None:
        """Queue the graph under ``operation_id`` (at the head of ComfyUI's queue when ``front``).

        A 400 is ComfyUI refusing the whole graph: InvalidInput with a safe summary of the
        first refused node. A 200 whose ``node_errors`` is not empty queued the valid output
        nodes and dropped the others: the prompt runs, and their summary is returned.
        """
        payload: dict[str, Any] = {
            "prompt": workflow,
            "prompt_id": operation_id,
            "client_id": self.client_id,
            "extra_data": {"reckon_outputs": indices},
        }
        if front:
            payload["front"] = True
        response = self.transport.request("POST", "/prompt", orjson.dumps(payload), accept=(400,))
        if response.status == 400:
            raise _refusal(response.body, workflow)
        answer = _loads(response.body)
        if not isinstance(answer, dict):
            return None  # queued (200); what it refused, if anything, is unreadable
        if answer.get("prompt_id", operation_id) != operation_id:  # a ComfyUI too old to take our id
            raise UnknownOutcome("provider_ignored_prompt_id")
        return node_error_detail(answer.get("node_errors"), workflow)

    def cancel(self, operation_id: str) -> None:
        """Drop the prompt from ComfyUI's queue, then interrupt it if it is the one running.

        In this order nothing slips between the two: a prompt taken off the queue between
        them is running when the interrupt arrives. ComfyUI's ``/interrupt`` checks the
        running prompt's id itself (v0.3.64; an older one interrupts whatever runs, so never
        point this adapter at one). Left to ComfyUI: if our prompt finishes in the
        microseconds between that check and its setting the interrupt flag, and the next
        prompt starts and clears the flag before it is set, that next prompt is interrupted.
        """
        self.transport.request("POST", "/queue", orjson.dumps({"delete": [operation_id]}))
        self.transport.request("POST", "/interrupt", orjson.dumps({"prompt_id": operation_id}))

    def status(self, operation_id: str) -> OperationStatus:
        """History, then the queue, then history again: a prompt that finishes between the
        first two reads is in the history by the third, so it is never taken for unknown."""
        entry = self._history(operation_id)
        if entry:
            return from_history(entry)
        queue = _json_object(self.transport.request("GET", "/queue").body, "queue_running", "queue_pending")
        for state, items in (("running", queue["queue_running"]), ("pending", queue["queue_pending"])):
            if any(isinstance(item, list) and len(item) > 1 and item[1] == operation_id for item in items):
                return OperationStatus(state)
        entry = self._history(operation_id)
        return from_history(entry) if entry else OperationStatus("unknown")

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

    def offers(self) -> Offer | None:
        """Its node classes (``GET /object_info``) and, for each folder reckon checks, its model files
        (``GET /models/<folder>``): read without authentication, as ComfyUI serves them. None when
        the server has no ``/object_info`` (404)."""
        info = self.transport.request("GET", "/object_info", accept=(404,))
        if info.status == 404:
            return None
        nodes = _loads(info.body)
        folders = _loads(self.transport.request("GET", "/models").body)
        if not isinstance(nodes, dict) or not isinstance(folders, list):
            raise Transient("provider_answer_malformed")
        models = {}
        for folder in FOLDERS:
            if folder in folders:
                files = _loads(self.transport.request("GET", f"/models/{quote(folder)}").body)
                if not isinstance(files, list):
                    raise Transient("provider_answer_malformed")
                models[folder] = frozenset(str(name) for name in files)
        return Offer(frozenset(nodes), models)

    def fetch(self, ref: OutputRef) -> bytes:
        """The file as ComfyUI wrote it (metadata included: media.describe strips it).

        A 404 means the history lists a file the server no longer has (its output folder was
        cleaned): OutputLost, a paid output gone, not the client's invalid input."""
        query = urlencode({"filename": ref.filename, "subfolder": ref.subfolder, "type": ref.folder_type})
        response = self.transport.request("GET", f"/view?{query}", accept=(404,), limit=self.fetch_seconds)
        if response.status == 404:
            raise OutputLost("provider_http_404")
        return response.body


    def input_size(self, filename: str) -> int | None:
        """The size of the file ``filename`` in reckon's subfolder of the input folder, None if there is
        none: ``HEAD /view`` (aiohttp answers HEAD for GET routes), its Content-Length, no body."""
        query = urlencode({"filename": filename, "subfolder": SUBFOLDER, "type": "input"})
        response = self.transport.request("HEAD", f"/view?{query}", accept=(404,))
        if response.status == 404:
            return None
        length = response.headers.get("content-length", "")
        if not length.isascii() or not length.isdigit():
            raise Transient("provider_answer_malformed")
        return int(length)

    def upload_input(self, filename: str, data: bytes, *, overwrite: bool = False) -> None:
        """Put ``data`` at ``filename`` in reckon's subfolder of the input folder (``POST /upload/image``,
        ``type=input``). Without ``overwrite`` ComfyUI keeps a file of that name holding the same bytes
        (a duplicate: never rewritten under a prompt that reads it) and saves other bytes as
        ``name (1).ext``: an answer naming another file means ours holds other bytes (a truncated
        copy, an operator's), so it is sent again with ``overwrite``."""
        for replace in (True,) if overwrite else (False, True):
            fields = {"type": "input", "subfolder": SUBFOLDER, **({"overwrite": "true"} if replace else {})}
            body, content_type = multipart(fields, "image", filename, data)
            answer = _loads(self.transport.request("POST", "/upload/image", body, content_type=content_type).body)
            if not isinstance(answer, dict):
                raise Transient("provider_answer_malformed")
            if answer.get("name") == filename and answer.get("subfolder") == SUBFOLDER:
                return
        raise Transient("provider_input_misplaced")


def _refusal(body: bytes, workflow: dict[str, Any]) -> InvalidInput:
    """ComfyUI's 400 as InvalidInput: reason its error type (``prompt_outputs_failed_validation``,
    ``invalid_prompt``, ...), detail the first refused node or the graph-level error."""
    answer = _loads(body)
    if not isinstance(answer, dict) or not isinstance(answer.get("error"), dict):
        return InvalidInput("provider_http_400")  # not ComfyUI's explanation: keep what is known
    error = answer["error"]
    kind = error.get("type")
    reason = kind if isinstance(kind, str) and SAFE_REASON.fullmatch(kind) else "provider_invalid_prompt"
    detail = node_error_detail(answer.get("node_errors"), workflow) or prompt_error_detail(error, workflow)
    return InvalidInput(reason, detail=detail)


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _json_object(body: bytes, *lists: str) -> dict[str, Any]:
    """A JSON object with the given list members, or Transient: an answer we cannot read is
    never taken to mean "no such operation"."""
    value = _loads(body)
    if not isinstance(value, dict) or any(not isinstance(value.get(name), list) for name in lists):
        raise Transient("provider_answer_malformed")
    return value
