"""reckon end to end against a real ComfyUI: admission, a Dramatiq worker, the websocket watcher
and the sweeper, in watch mode (the worker's thread is free while ComfyUI renders)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.providers.media import describe
from pipeline.state.jobs import job_view
from pipeline.state.store import Store
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import blur, empty, save
from tests.conftest import wait_until
from tests.pipeline.conftest import InProcess

TERMINAL = ("completed", "failed", "cancelled", "needs_review")


@pytest.fixture
def stack(store, settings, broker, comfyui: RealComfyUI) -> Iterator[InProcess]:
    with InProcess(store, settings, broker, {"gpu": comfyui}) as running:
        yield running


def ended(store: Store, job_id: str, timeout: float = 60.0) -> dict[str, str]:
    wait_until(lambda: store.job(job_id)["state"] in TERMINAL, timeout=timeout, interval=0.05)
    return store.job(job_id)


def executions(comfyui: RealComfyUI, job_id: str, store: Store) -> int:
    """How many times ComfyUI ran the job's prompts (its history, by our operation ids)."""
    return sum(len(comfyui.get(f"/history/{a['operation_id']}")) for a in store.attempts(job_id))


def test_a_job_completes_once_with_its_outputs_stripped_and_hashed(store, settings, admit, stack, comfyui) -> None:
    prefix = f"e2e-{comfyui.color()}"
    logged = comfyui.executions()
    job_id = admit(workflow={"1": empty(comfyui.color(), batch=2), "9": save("1", prefix)}, outputs=2)
    job = ended(store, job_id)
    wait_until(lambda: comfyui.executions() > logged)
    assert (job["state"], job["attempt_count"], job["settled"]) == ("completed", "1", "20")
    files = comfyui.files(prefix)
    assert len(files) == 2
    written = [hashlib.sha256(describe(path.read_bytes(), path.name)[0]).hexdigest() for path in files]
    stored = store.outputs(job_id)
    assert [stored[i]["sha256"] for i in (0, 1)] == written  # ComfyUI's order: node, then position
    blobs = BlobStore(settings.blob_dir)
    assert all(b"prompt" not in blobs.read(stored[i]["sha256"]) for i in (0, 1))  # no embedded workflow
    assert {stored[i]["content_type"] for i in (0, 1)} == {"image/png"}
    assert executions(comfyui, job_id, store) == 1 and comfyui.executions() == logged + 1  # history and log
    operation_id = store.attempts(job_id)[0]["operation_id"]
    assert operation_id in comfyui.get(f"/history/{operation_id}")


def test_images_beyond_the_request_are_not_kept_but_are_paid(store, admit, stack, comfyui) -> None:
    """ComfyUI runs the whole graph: what it made is what the run costs (here within the reservation)."""
    job_id = admit(workflow={"1": empty(comfyui.color(), batch=2), "9": save("1", "extra")}, outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["settled"]) == ("completed", "20")
    assert sorted(store.outputs(job_id)) == [0] and executions(comfyui, job_id, store) == 1


def test_an_invalid_graph_fails_with_a_useful_error_and_no_retry(store, admit, stack, comfyui) -> None:
    job_id = admit(workflow={"1": empty(None), "9": save("1", "invalid")}, outputs=1)  # color is missing
    job = ended(store, job_id)
    assert (job["state"], job["error_class"], job["attempt_count"]) == ("failed", "invalid_input", "1")
    error = view(store, job_id)["error"]
    assert error["detail"]["node_id"] == "1" and error["detail"]["class_type"] == "EmptyImage"
    assert executions(comfyui, job_id, store) == 0 and job["settled"] == "0"


def test_a_runtime_error_fails_once_and_is_not_paid_again(store, admit, stack, comfyui) -> None:
    job_id = admit(workflow={"1": empty(comfyui.color()), "9": save("1", "../x")}, outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["error_class"], job["attempt_count"]) == ("failed", "execution_failed", "1")
    detail = view(store, job_id)["error"]["detail"]
    assert (detail["node_id"], detail["class_type"]) == ("9", "SaveImage")
    assert "/tmp" not in detail["message"]  # no server path, no input value
    assert executions(comfyui, job_id, store) == 1


def test_fewer_images_than_requested_fail_for_good_and_pay_what_was_made(store, admit, stack, comfyui) -> None:
    job_id = admit(workflow={"1": empty(comfyui.color(), batch=2), "9": save("1", "short")}, outputs=3)
    job = ended(store, job_id)
    assert (job["state"], job["error_reason"], job["attempt_count"]) == ("failed", "provider_outputs_missing", "1")
    assert sorted(store.outputs(job_id)) == [0, 1] and job["settled"] == "20"  # two made, two paid
    assert executions(comfyui, job_id, store) == 1


def test_a_comfyui_restart_mid_prompt_sends_the_job_to_review(store, admit, stack, comfyui) -> None:
    slow = {"1": empty(comfyui.color(), batch=2, size=1024), "2": blur("1"), "9": save("2", "slow")}
    job_id = admit(workflow=slow, outputs=2)
    wait_until(lambda: store.job(job_id).get("lease_owner") == "watcher", timeout=20)
    wait_until(lambda: running(comfyui) == [store.job(job_id)["operation_id"]], timeout=20)
    comfyui.restart()  # history is in memory and ComfyUI shows no boot id: the outcome is unknowable
    job = ended(store, job_id, timeout=60)
    assert (job["state"], job["error_reason"]) == ("needs_review", "outcome_unknowable")
    assert job["uncertain"] == "20"  # held until an operator decides; nothing was submitted again
    assert len(store.attempts(job_id)) == 1


def running(comfyui: RealComfyUI) -> list[str]:
    return [item[1] for item in comfyui.get("/queue")["queue_running"]]


def view(store: Store, job_id: str) -> dict[str, Any]:
    return job_view(store.job(job_id), store.outputs(job_id))
