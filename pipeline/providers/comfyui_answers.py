"""Reading ComfyUI's answers (v0.3.64): a history entry as an OperationStatus, a refused or partly
refused graph as a safe summary.

Which files are a job's outputs: every ``type: "output"`` file a node reports
(``PreviewImage`` writes ``type: "temp"`` ones, never outputs), whatever list it
is in: ``images`` (PNG, JPEG, WEBP, animated WEBP and PNG, and the video files
``SaveVideo`` lists there with ``animated``), ``audio`` (``SaveAudio`` and kin),
``gifs`` (VideoHelperSuite) and any other list of ``{filename, subfolder, type}``.
They are ordered by node id (numerically when the id is a number, then as text),
then by list within a node (``images``, ``audio``, ``gifs``, then the others by
name), then by position in the list. ComfyUI lists its nodes in Python set order,
which changes from process to process, so its own order is never used. The files
are mapped onto the requested indices in that order; files beyond the requested
count are ignored (a graph may save more than it was asked for) but counted in
``produced`` (a run is charged whole), and a graph that saved fewer completes
with fewer outputs.

A summary (``detail``) names the node id, its class type, the error type, the
input name when ComfyUI gives one, and a message: the first line of ComfyUI's
message, with every string input of the graph (three characters or more) and
every input value of the failing node replaced by "…", cut to 300 characters.
ComfyUI's ``details``, ``current_inputs`` and tracebacks, which echo input
values and server paths, are never read.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.mediatypes import type_for_name

#: Longest message kept in a summary, in characters.
MAX_MESSAGE = 300
#: Longest class type, error type or input name kept in a summary, in characters.
MAX_NAME = 100
#: String inputs shorter than this are not redacted from messages (they would mangle its words).
MIN_REDACTED = 3
REDACTED = "…"
#: A provider error type safe to keep as a reason (ComfyUI's are lower-case identifiers).
SAFE_REASON = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The lists of a node's output read first, in this order; any other list follows, by name.
OUTPUT_LISTS = ("images", "audio", "gifs")
_NUMERIC_ID = re.compile(r"[0-9]{1,18}")
#: ``details`` of ComfyUI's graph-level errors name the node as "Node ID '#7'".
_NODE_REF = re.compile(r"Node ID '#([^']{1,64})'")
#: Exception types that depend on the server's load and size, not on the graph: worth another try.
_RETRYABLE_EXCEPTIONS = re.compile(r"(.*\.)?OutOfMemoryError")


def node_order(node_id: str) -> tuple[int, int, str]:
    """Sort key: numeric node ids first, by value, then the others as text."""
    return (0, int(node_id), "") if _NUMERIC_ID.fullmatch(node_id) else (1, 0, node_id)


def from_history(entry: dict[str, Any]) -> OperationStatus:
    """The status a finished history entry describes."""
    status = _dict(entry.get("status"))
    prompt = _list(entry.get("prompt"))  # [number, prompt_id, graph, extra_data, output node ids]
    workflow = _dict(prompt[2] if len(prompt) > 2 else None)
    extra = _dict(prompt[3] if len(prompt) > 3 else None)
    refs = output_refs(entry.get("outputs"), extra.get("reckon_outputs"))
    produced = len(output_files(entry.get("outputs")))
    seconds_ms = execution_ms(status.get("messages"))
    if status.get("status_str") == "error":
        return replace(_failure(status.get("messages"), refs, workflow), produced=produced, seconds_ms=seconds_ms)
    if not status.get("completed", True):
        return OperationStatus("running")
    return OperationStatus("completed", refs, produced=produced, seconds_ms=seconds_ms)


def execution_ms(messages: Any) -> int | None:
    """Milliseconds from ComfyUI's ``execution_start`` to its ``execution_success`` (``_error``,
    ``_interrupted``), by the ``timestamp`` (ms) each carries; None without both (an older server), or
    with an end stamped before its start (unreadable: booked the bound, never 0). A fully cached run's
    two messages are a few milliseconds apart: it executed nothing else."""
    stamps: dict[str, int] = {}
    for event, data in (message for message in _list(messages) if _is_message(message)):
        stamp = data.get("timestamp")
        if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp >= 0:
            stamps.setdefault("start" if event == "execution_start" else event, stamp)
    ends = [stamps[e] for e in ("execution_success", "execution_error", "execution_interrupted") if e in stamps]
    if "start" not in stamps or not ends or ends[0] < stamps["start"]:
        return None
    return ends[0] - stamps["start"]


def output_refs(outputs: Any, requested: Any) -> list[OutputRef]:
    """The ``output`` files in a deterministic order, mapped onto the requested indices."""
    files = output_files(outputs)
    if isinstance(requested, list) and all(type(index) is int for index in requested):
        indices = requested
    else:  # not asked by reckon (or by an older reckon): every file, in order
        indices = list(range(len(files)))
    return [OutputRef(index, file["filename"], _text(file.get("subfolder")), "output",
                      content_type=type_for_name(file["filename"]))
            for index, file in zip(indices, files, strict=False)]  # extra files are not ours


def output_files(outputs: Any) -> list[dict[str, Any]]:
    """Every ``output`` file of a run: by node id, then list (``list_order``), then position."""
    files: list[dict[str, Any]] = []
    outputs = _dict(outputs)
    for node_id in sorted(outputs, key=node_order):
        node = _dict(outputs[node_id])
        for name in sorted(node, key=list_order):
            files += [file for file in _list(node[name]) if _is_output(file)]
    return files


def list_order(name: str) -> tuple[int, str]:
    """Sort key of a node's output lists: OUTPUT_LISTS first, in that order, then the others by name."""
    return (OUTPUT_LISTS.index(name), "") if name in OUTPUT_LISTS else (len(OUTPUT_LISTS), name)


def _is_output(file: Any) -> bool:
    return isinstance(file, dict) and file.get("type") == "output" and isinstance(file.get("filename"), str)


def _failure(messages: Any, refs: list[OutputRef], workflow: dict[str, Any]) -> OperationStatus:
    """A failed run: ComfyUI's ``execution_error`` (not retryable unless out of memory) or
    ``execution_interrupted`` (stopped at the server: a cancellation, not retried)."""
    for event, data in (message for message in _list(messages) if _is_message(message)):
        node_id = _text(data.get("node_id"))
        where = {"node_id": node_id, "class_type": _text(data.get("node_type"), MAX_NAME)}
        if event == "execution_interrupted":
            detail = {**where, "error_type": "execution_interrupted"}
            return OperationStatus("interrupted", refs, error="provider_interrupted", retryable=False, detail=detail)
        if event == "execution_error":
            error_type = _text(data.get("exception_type"), MAX_NAME)
            message = safe_message(_text(data.get("exception_message"), 10_000), workflow, node_id)
            detail = {**where, "error_type": error_type, "message": message}
            retryable = bool(_RETRYABLE_EXCEPTIONS.fullmatch(error_type))
            return OperationStatus("failed", refs, error="provider_execution_error", retryable=retryable,
                                   detail=detail)
    return OperationStatus("failed", refs, error="provider_execution_error")  # no evidence it would fail again


def _is_message(message: Any) -> bool:
    return isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict)


def node_error_detail(node_errors: Any, workflow: dict[str, Any]) -> dict[str, str] | None:
    """A summary of the first refused node (lowest id) and its first error, or None if none."""
    if not isinstance(node_errors, dict) or not node_errors:
        return None
    node_id = min(node_errors, key=node_order)
    entry = _dict(node_errors[node_id])
    errors = _list(entry.get("errors"))
    first = _dict(errors[0] if errors else None)
    detail = {"node_id": node_id, "class_type": _text(entry.get("class_type"), MAX_NAME),
              "error_type": _text(first.get("type"), MAX_NAME),
              "message": safe_message(_text(first.get("message"), 10_000), workflow, node_id)}
    extra = _dict(first.get("extra_info"))
    if isinstance(extra.get("input_name"), str):
        detail["input_name"] = _text(extra["input_name"], MAX_NAME)
    return detail


def prompt_error_detail(error: Any, workflow: dict[str, Any]) -> dict[str, str]:
    """A summary of a graph-level refusal (unknown node, no outputs), naming the node if it can."""
    error = _dict(error)
    detail = {"error_type": _text(error.get("type"), MAX_NAME)}
    node = _NODE_REF.search(_text(error.get("details"), 1_000))
    if node:
        detail["node_id"] = node.group(1)
        spec = workflow.get(node.group(1))
        if isinstance(spec, dict) and isinstance(spec.get("class_type"), str):
            detail["class_type"] = _text(spec["class_type"], MAX_NAME)
    detail["message"] = safe_message(_text(error.get("message"), 10_000), workflow, detail.get("node_id"))
    return detail


def safe_message(text: str, workflow: dict[str, Any], node_id: str | None) -> str:
    """The first line of ``text`` without the graph's input values, at most MAX_MESSAGE characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    for value in sorted(_string_inputs(workflow), key=len, reverse=True):
        line = line.replace(value, REDACTED)
    for value in _node_values(workflow, node_id):
        line = re.sub(rf"(?<![\w.]){re.escape(value)}(?![\w.])", REDACTED, line)
    return line[:MAX_MESSAGE]


def _string_inputs(workflow: dict[str, Any]) -> set[str]:
    return {value for spec in workflow.values() if isinstance(spec, dict) and isinstance(spec.get("inputs"), dict)
            for value in spec["inputs"].values() if isinstance(value, str) and len(value) >= MIN_REDACTED}


def _node_values(workflow: dict[str, Any], node_id: str | None) -> list[str]:
    """The failing node's scalar inputs as text (numbers too: ComfyUI writes "Value -5 smaller than...")."""
    spec = workflow.get(node_id) if node_id is not None else None
    inputs = spec.get("inputs") if isinstance(spec, dict) else None
    if not isinstance(inputs, dict):
        return []
    return [str(value) for value in inputs.values()
            if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value)]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any, limit: int = MAX_NAME) -> str:
    return value[:limit] if isinstance(value, str) else ""
