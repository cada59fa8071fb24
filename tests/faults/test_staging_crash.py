"""A worker SIGKILLed while it puts a job's inputs on the server (the ``input_uploaded`` fault point:
one of two inputs sent, the prompt not): the job completes, charged once, and no input is sent twice."""

from __future__ import annotations

from urllib.request import urlopen

import orjson

from pipeline.blobs.local import BlobStore
from pipeline.providers.sim.comfy import png
from tests.conftest import wait_until
from tests.faults.test_crashes import finished, setup
from tests.inputs import upload


def sim_inputs(stack) -> dict:
    with urlopen(f"http://127.0.0.1:{stack.sim_port}/sim/inputs", timeout=5) as resp:
        return orjson.loads(resp.read())


def killed_at(stack, auth: dict[str, str], workflow: dict, pause_at: str) -> str:
    """Web, sweeper and a worker that stops at ``pause_at``; the job of ``workflow`` submitted over HTTP
    and the worker SIGKILLed once it stopped there; the job's id."""
    stack.start_web()
    stack.start_worker(pause_at=pause_at)
    stack.start_sweeper()
    status, headers, _ = stack.api("POST", "/v1/jobs", {"kind": "image", "workflow": workflow, "outputs": 1},
                                   **auth, **{"Idempotency-Key": f"killed-at-{pause_at}"})
    assert status == 202
    stack.kill_when_paused("worker")
    return headers["location"].rsplit("/", 1)[1]


def test_worker_killed_mid_upload_completes_charged_once(stack, redis_client, store, settings) -> None:
    auth = setup(stack, redis_client)
    blobs = BlobStore(stack.env["RECKON_BLOB_DIR"])
    names = [upload(store, settings, png(seed, 16), blob_dir=stack.env["RECKON_BLOB_DIR"])
             for seed in ("crash-a", "crash-b")]
    workflow = {"1": {"class_type": "LoadImage", "inputs": {"image": names[0]}},
                "2": {"class_type": "LoadImageMask", "inputs": {"image": names[1], "channel": "alpha"}},
                "9": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "crash"}}}
    stack.start_provider()
    job_id = killed_at(stack, auth, workflow, "input_uploaded")  # one input on the server, no prompt sent
    assert sim_inputs(stack)["uploads"] == 1 and store.job(job_id)["submitted"] == "0"
    stack.start_worker()
    wait_until(lambda: finished(store, job_id), timeout=40)
    job = store.job(job_id)
    assert (job["state"], job["settled"]) == ("completed", "10")
    # the dead worker's lease lapsed; reconciliation found the attempt never submitted (nothing to pay)
    assert [(a["state"], a["error_class"]) for a in store.attempts(job_id)] == [
        ("failed", "not_executed"), ("completed", None)]
    assert [e["to"] for e in store.events(job_id)] == [
        "queued", "running", "reconciling", "retry_wait", "queued", "running", "completed"]
    assert stack.charges()["total_units"] == 10 and len(stack.charges()["charges"]) == 1
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 10,
                                    "available": 990}
    held = sim_inputs(stack)
    assert held["uploads"] == 2  # the first input was found on the server, not sent again
    assert held["files"] == {name: len(blobs.read(name[7:71])) for name in names}
