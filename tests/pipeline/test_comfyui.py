"""The ComfyUI adapter against the simulated ComfyUI over real loopback HTTP, and its reading of
ComfyUI's answers (shapes recorded from ComfyUI v0.3.64; tests/comfyui/ runs the real one)."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.errors import InvalidInput, OutputLost, Unreachable
from pipeline.providers import sim as simulated
from pipeline.providers.base import OutputRef
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.comfyui_answers import from_history, node_error_detail, prompt_error_detail, safe_message
from pipeline.providers.http import HttpTransport
from tests.conftest import wait_until

WORKFLOW = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": -5, "height": 8, "batch_size": 1, "color": 7}},
    "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a secret castle", "clip": ["4", 1]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "../x"}},
}


def adapter(server: simulated.SimServer) -> ComfyUI:
    return ComfyUI(HttpTransport(server.url, timeout=5), price_per_output=10)


def image(filename: str, kind: str = "output") -> dict[str, str]:
    return {"filename": filename, "subfolder": "", "type": kind}


def entry(outputs: dict, *, status: str = "success", messages: list | None = None,
          requested: list[int] | None = None) -> dict:
    extra = {"client_id": "reckon"} | ({"reckon_outputs": requested} if requested is not None else {})
    return {"prompt": [0, "op", WORKFLOW, extra, ["9"]], "outputs": outputs,
            "status": {"status_str": status, "completed": status == "success", "messages": messages or []}}


def test_submit_then_status_by_our_operation_id() -> None:
    server = simulated.start(delay=0.3)
    try:
        comfy = adapter(server)
        assert comfy.status("op-1").state == "unknown"
        assert comfy.submit("op-1", {"3": {"class_type": "KSampler"}}, [0, 2]) is None
        assert comfy.submit("op-2", {"3": {"class_type": "KSampler"}}, [0], front=True) is None
        assert {comfy.status("op-1").state, comfy.status("op-2").state} == {"running", "pending"}
        wait_until(lambda: comfy.status("op-1").state == "completed")
        done = comfy.status("op-1")
        assert [ref.index for ref in done.outputs] == [0, 2]
        assert {ref.content_type for ref in done.outputs} == {"image/png"}
        data = [comfy.fetch(ref) for ref in done.outputs]
        assert len({hashlib.sha256(d).hexdigest() for d in data}) == 2
        wait_until(lambda: comfy.status("op-2").state == "completed")
        assert [c["prompt_id"] for c in server.sim.charges] == ["op-1", "op-2"]
    finally:
        server.close()


def test_rejected_prompt_and_dead_provider_are_classified(sim) -> None:
    with pytest.raises(InvalidInput) as refused:
        adapter(sim).submit("op-1", {}, [0])
    assert refused.value.reason == "prompt_no_outputs"
    assert refused.value.detail == {"error_type": "prompt_no_outputs", "message": "Prompt has no outputs"}
    assert sim.sim.charges == []
    closed = simulated.start()
    closed.close()
    with pytest.raises(Unreachable) as unreachable:
        adapter(closed).submit("op-2", {"1": {}}, [0])
    assert (unreachable.value.reason, unreachable.value.error_class) == ("connect_failed", "provider_unreachable")


def test_a_failing_read_is_unreachable_and_a_missing_file_is_a_lost_output(sim) -> None:
    sim.sim.faults = [{"kind": "read_error", "path": "/history", "status": 503}]
    with pytest.raises(Unreachable) as failing:
        adapter(sim).status("op-1")
    assert failing.value.reason == "provider_http_503"
    with pytest.raises(OutputLost) as lost:
        adapter(sim).fetch(OutputRef(0, "reckon_gone_0_1.png"))
    assert (lost.value.error_class, lost.value.reason) == ("provider_output_lost", "provider_http_404")


def test_every_output_file_counts_by_node_id_then_list_then_position() -> None:
    """images, audio, gifs, then other lists by name; temp files and non-file lists are not outputs."""
    outputs = {"3": {"images": [image("p1.png", "temp")]}, "10": {"images": [image("c.webp"), image("d.png")]},
               "2": {"images": [image("a.png"), image("b.png")]}, "sub:1": {"images": [image("e.png")]},
               "7": {"zz": [image("z.glb")], "gifs": [image("v.mp4")], "audio": [image("x.flac")],
                     "animated": [True], "text": ["hello"], "3d": [image("m.glb")], "images": [image("w.webp")]}}
    status = from_history(entry(outputs, requested=[0, 1, 2, 3, 4, 5, 6, 7, 8]))
    assert status.state == "completed" and status.produced == 10
    assert [(ref.index, ref.filename, ref.content_type) for ref in status.outputs] == [
        (0, "a.png", "image/png"), (1, "b.png", "image/png"), (2, "w.webp", "image/webp"),
        (3, "x.flac", "audio/flac"), (4, "v.mp4", "video/mp4"), (5, "m.glb", "model/gltf-binary"),
        (6, "z.glb", "model/gltf-binary"), (7, "c.webp", "image/webp"), (8, "d.png", "image/png")]


def test_missing_retries_map_onto_the_requested_indices_and_fewer_images_still_complete() -> None:
    two = {"9": {"images": [image("a.png"), image("b.png")]}}
    assert [(r.index, r.filename) for r in from_history(entry(two, requested=[1, 3])).outputs] == [
        (1, "a.png"), (3, "b.png")]
    fewer = from_history(entry(two, requested=[0, 1, 2]))
    assert (fewer.state, [r.index for r in fewer.outputs]) == ("completed", [0, 1])
    assert [r.index for r in from_history(entry(two)).outputs] == [0, 1]  # not asked by reckon: all of them


def test_an_execution_error_is_terminal_with_a_summary_that_echoes_no_input() -> None:
    error = {"prompt_id": "op", "node_id": "9", "node_type": "SaveImage", "exception_type": "Exception",
             "exception_message": "**** ERROR: cannot save ../x for a secret castle\n full_output_folder: /srv",
             "traceback": ["..."], "current_inputs": {"filename_prefix": ["../x"]}, "executed": ["1"]}
    status = from_history(entry({}, status="error", messages=[["execution_start", {}], ["execution_error", error]]))
    assert (status.state, status.error, status.retryable, status.outputs) == (
        "failed", "provider_execution_error", False, [])
    assert status.detail == {"node_id": "9", "class_type": "SaveImage", "error_type": "Exception",
                             "message": "**** ERROR: cannot save … for …"}
    oom = {**error, "exception_type": "torch.OutOfMemoryError"}
    assert from_history(entry({}, status="error", messages=[["execution_error", oom]])).retryable is True


def test_an_interrupt_at_the_provider_is_a_cancellation_and_a_silent_error_may_be_retried() -> None:
    stopped = {"prompt_id": "op", "node_id": "9", "node_type": "SaveImage", "executed": ["1"]}
    made = {"9": {"images": [image("a.png")]}}
    status = from_history(entry(made, status="error", messages=[["execution_interrupted", stopped]]))
    assert (status.state, status.error, status.retryable) == ("interrupted", "provider_interrupted", False)
    assert status.detail == {"node_id": "9", "class_type": "SaveImage", "error_type": "execution_interrupted"}
    assert [r.filename for r in status.outputs] == ["a.png"]  # made before the stop: paid for, kept
    silent = from_history(entry(made, status="error"))  # the simulator's partial run
    assert (silent.state, silent.retryable, silent.detail) == ("failed", True, None)


def test_node_errors_summarise_the_lowest_node_without_values() -> None:
    node_errors = {
        "12": {"errors": [{"type": "required_input_missing", "message": "Required input is missing",
                           "details": "color", "extra_info": {"input_name": "color"}}], "class_type": "EmptyImage"},
        "1": {"errors": [{"type": "value_smaller_than_min", "message": "Value -5 smaller than min of 1",
                          "details": "width", "extra_info": {"input_name": "width", "received_value": -5}}],
              "class_type": "EmptyImage", "dependent_outputs": ["9"]},
    }
    assert node_error_detail(node_errors, WORKFLOW) == {
        "node_id": "1", "class_type": "EmptyImage", "error_type": "value_smaller_than_min",
        "message": "Value … smaller than min of …", "input_name": "width"}  # 1 is batch_size's value: redacted
    assert node_error_detail({}, WORKFLOW) is None
    unknown = {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not exist.",
               "details": "Node ID '#2'", "extra_info": {}}
    assert prompt_error_detail(unknown, WORKFLOW) == {
        "error_type": "invalid_prompt", "node_id": "2", "class_type": "CLIPTextEncode",
        "message": "Cannot execute because node NoSuchNode does not exist."}


def test_safe_messages_are_one_line_and_bounded() -> None:
    assert safe_message("\n  first line  \nsecond", {}, None) == "first line"
    assert len(safe_message("y" * 1_000, {}, None)) == 300
    assert safe_message("width 10.0 and 10.05", {"5": {"inputs": {"w": 10.0}}}, "5") == "width … and 10.05"
