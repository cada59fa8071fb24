"""The ComfyUI adapter against a real ComfyUI v0.3.64 (CPU, weights-free graphs)."""

from __future__ import annotations

import hashlib
import struct
import time
import uuid
from typing import Any

import pytest

from pipeline.errors import InvalidInput, OutputLost
from pipeline.providers.base import OperationStatus
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.media import describe
from tests.comfyui.conftest import RealComfyUI


def empty(color: int | None, *, batch: int = 1, size: int = 8, **inputs: Any) -> dict[str, Any]:
    """ComfyUI's EmptyImage; a None colour leaves the input out (a graph ComfyUI refuses)."""
    fields = {"width": size, "height": size, "batch_size": batch, "color": color, **inputs}
    return {"class_type": "EmptyImage", "inputs": {k: v for k, v in fields.items() if v is not None}}


def save(source: str, prefix: str, node: str = "SaveImage", **inputs: Any) -> dict[str, Any]:
    return {"class_type": node, "inputs": {"images": [source, 0], "filename_prefix": prefix, **inputs}}


def blur(source: str) -> dict[str, Any]:
    return {"class_type": "ImageBlur", "inputs": {"image": [source, 0], "blur_radius": 31, "sigma": 10.0}}


def new_id() -> str:
    return str(uuid.uuid4())


def settled(comfy: ComfyUI, operation_id: str, timeout: float = 30.0) -> OperationStatus:
    """The status once the prompt is neither pending nor running."""
    deadline = time.monotonic() + timeout
    while (status := comfy.status(operation_id)).state in ("pending", "running"):
        assert time.monotonic() < deadline, f"{operation_id} still {status.state}"
        time.sleep(0.05)
    return status


def png_tags(data: bytes) -> list[bytes]:
    tags, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        tags.append(data[offset + 4:offset + 8])
        offset += 12 + length
    return tags


def test_a_graph_runs_once_under_our_id_and_its_outputs_match_the_files_without_metadata(comfyui) -> None:
    comfy, op = comfyui.adapter(), new_id()
    prefix = f"happy-{op[:8]}"
    assert comfy.submit(op, {"1": empty(comfyui.color(), batch=2), "9": save("1", prefix)}, [0, 1]) is None
    status = settled(comfy, op)
    assert (status.state, [ref.index for ref in status.outputs]) == ("completed", [0, 1])
    files = comfyui.files(prefix)
    assert [ref.filename for ref in status.outputs] == [file.name for file in files]  # 2 files: it ran once
    for ref, file in zip(status.outputs, files, strict=True):
        raw = comfy.fetch(ref)
        assert raw == file.read_bytes() and b"tEXt" in png_tags(raw)  # ComfyUI embedded the graph
        clean, kind = describe(raw, ref.filename)
        assert (kind, ref.content_type) == ("image/png", "image/png")
        assert hashlib.sha256(clean).digest() == hashlib.sha256(describe(file.read_bytes(), file.name)[0]).digest()
        assert png_tags(clean) == [b"IHDR", b"IDAT", b"IEND"] and b"prompt" not in clean
    entry = comfyui.get(f"/history/{op}")[op]
    assert entry["prompt"][1] == op
    assert [event for event, _ in entry["status"]["messages"]].count("execution_start") == 1


def test_outputs_are_output_images_by_node_id_then_position_and_extras_are_ignored(comfyui) -> None:
    comfy, op, prefix = comfyui.adapter(), new_id(), f"order-{uuid.uuid4().hex[:8]}"
    graph = {"10": save("5", f"{prefix}-b"), "2": save("1", f"{prefix}-a"),
             "3": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
             "1": empty(comfyui.color(), batch=2), "5": empty(comfyui.color(), batch=2)}
    assert comfy.submit(op, graph, [0, 1, 2, 3]) is None
    status = settled(comfy, op)
    assert status.state == "completed"
    assert [(ref.index, ref.filename) for ref in status.outputs] == [
        (0, f"{prefix}-a_00001_.png"), (1, f"{prefix}-a_00002_.png"),
        (2, f"{prefix}-b_00001_.png"), (3, f"{prefix}-b_00002_.png")]
    listed = comfyui.get(f"/history/{op}")[op]["outputs"]
    assert [image["type"] for image in listed["3"]["images"]] == ["temp", "temp"]  # the preview: not an output
    fewer = new_id()
    graph["1"], graph["5"] = empty(comfyui.color(), batch=2), empty(comfyui.color(), batch=2)
    assert comfy.submit(fewer, graph, [4, 5]) is None
    assert [(ref.index, ref.filename) for ref in settled(comfy, fewer).outputs] == [
        (4, f"{prefix}-a_00003_.png"), (5, f"{prefix}-a_00004_.png")]


def test_an_animated_webp_is_typed_from_its_bytes_and_loses_the_graph_in_its_exif(comfyui) -> None:
    comfy, op, prefix = comfyui.adapter(), new_id(), f"webp-{uuid.uuid4().hex[:8]}"
    webp = save("1", prefix, "SaveAnimatedWEBP", fps=6.0, lossless=False, quality=80, method="default")
    assert comfy.submit(op, {"1": empty(comfyui.color(), batch=2, size=16), "9": webp}, [0]) is None
    [ref] = settled(comfy, op).outputs
    raw = comfy.fetch(ref)
    assert ref.content_type == "image/webp" and b"EXIF" in raw and b"prompt:" in raw
    clean, kind = describe(raw, ref.filename)
    assert kind == "image/webp" and b"EXIF" not in clean and b"prompt" not in clean and b"VP8" in clean


def test_an_invalid_graph_is_refused_with_the_node_and_class_type(comfyui) -> None:
    comfy, op = comfyui.adapter(), new_id()
    with pytest.raises(InvalidInput) as refused:
        comfy.submit(op, {"5": empty(None), "9": save("5", "never")}, [0])
    assert refused.value.reason == "prompt_outputs_failed_validation"
    assert refused.value.detail == {"node_id": "5", "class_type": "EmptyImage", "error_type": "required_input_missing",
                                    "message": "Required input is missing", "input_name": "color"}
    with pytest.raises(InvalidInput) as small:
        comfy.submit(new_id(), {"5": empty(comfyui.color(), batch=2, size=-5), "9": save("5", "never")}, [0])
    assert small.value.detail is not None and small.value.detail["message"] == "Value … smaller than min of 1"
    with pytest.raises(InvalidInput) as unknown:
        comfy.submit(new_id(), {"7": {"class_type": "NoSuchNode", "inputs": {}}}, [0])
    assert (unknown.value.reason, unknown.value.detail) == ("invalid_prompt", {
        "error_type": "invalid_prompt", "node_id": "7", "class_type": "NoSuchNode",
        "message": "Cannot execute because node NoSuchNode does not exist."})
    assert comfyui.get(f"/history/{op}") == {} and comfy.status(op).state == "unknown"


def test_a_runtime_error_fails_for_good_with_a_summary_that_names_no_path(comfyui: RealComfyUI) -> None:
    comfy, op = comfyui.adapter(), new_id()
    assert comfy.submit(op, {"1": empty(comfyui.color()), "9": save("1", "../x")}, [0]) is None
    status = settled(comfy, op)
    assert (status.state, status.error, status.retryable, status.outputs) == (
        "failed", "provider_execution_error", False, [])
    assert status.detail == {"node_id": "9", "class_type": "SaveImage", "error_type": "Exception",
                             "message": "**** ERROR: Saving image outside the output folder is not allowed."}


def test_a_partly_valid_graph_is_queued_and_submit_returns_what_was_refused(comfyui) -> None:
    comfy, op, prefix = comfyui.adapter(), new_id(), f"partial-{uuid.uuid4().hex[:8]}"
    graph = {"1": empty(comfyui.color()), "2": save("1", prefix),
             "3": empty(None), "4": save("3", f"{prefix}-never")}
    assert comfy.submit(op, graph, [0, 1]) == {
        "node_id": "3", "class_type": "EmptyImage", "error_type": "required_input_missing",
        "message": "Required input is missing", "input_name": "color"}
    status = settled(comfy, op)
    assert (status.state, [ref.filename for ref in status.outputs]) == ("completed", [f"{prefix}_00001_.png"])


def test_a_file_cleaned_from_the_output_folder_is_a_lost_output(comfyui) -> None:
    comfy, op, prefix = comfyui.adapter(), new_id(), f"lost-{uuid.uuid4().hex[:8]}"
    assert comfy.submit(op, {"1": empty(comfyui.color()), "9": save("1", prefix)}, [0]) is None
    [ref] = settled(comfy, op).outputs
    for file in comfyui.files(prefix):
        file.unlink()
    with pytest.raises(OutputLost):
        comfy.fetch(ref)


def test_cancel_drops_a_pending_prompt_and_interrupts_only_our_running_one(comfyui) -> None:
    comfy, tag = comfyui.adapter(), uuid.uuid4().hex[:8]
    slow, later, urgent, dropped = new_id(), new_id(), new_id(), new_id()
    graph = {"1": empty(comfyui.color(), batch=2, size=1024), "2": blur("1"), "3": blur("2"),
             "9": save("3", f"slow-{tag}")}
    assert comfy.submit(slow, graph, [0]) is None
    deadline = time.monotonic() + 10
    while comfy.status(slow).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for op, name, front in ((later, "later", False), (urgent, "urgent", True), (dropped, "dropped", False)):
        tiny = {"1": empty(comfyui.color()), "9": save("1", f"{name}-{tag}")}
        assert comfy.submit(op, tiny, [0], front=front) is None
    assert comfy.status(dropped).state == "pending"
    comfy.cancel(dropped)
    assert comfy.status(dropped).state == "unknown"
    comfy.cancel(slow)
    stopped = settled(comfy, slow)
    assert (stopped.state, stopped.error, stopped.retryable, stopped.outputs) == (
        "interrupted", "provider_interrupted", False, [])
    assert stopped.detail is not None and stopped.detail["class_type"] == "ImageBlur"
    assert settled(comfy, later).state == settled(comfy, urgent).state == "completed"
    assert started(comfyui, urgent) < started(comfyui, later)  # front: ahead of the queue
    comfy.cancel(later)  # finished: harmless
    assert comfy.status(later).state == "completed"
    assert comfyui.files(f"dropped-{tag}") == [] and comfyui.files(f"slow-{tag}") == []
    assert comfy.status(dropped).state == "unknown"


def started(comfyui: RealComfyUI, op: str) -> int:
    messages = comfyui.get(f"/history/{op}")[op]["status"]["messages"]
    return next(data["timestamp"] for event, data in messages if event == "execution_start")
