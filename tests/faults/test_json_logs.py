"""Every line of every process of a real stack (gunicorn, the Dramatiq worker, watcher, sweeper,
simulated provider) is one JSON object while a job runs, each state change of the job among them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dramatiq
import orjson

from pipeline.logs import OUTPUT_ROUTE
from tests.conftest import wait_until
from tests.faults.test_crashes import finished, setup, submit

CANARY = "canary-6f1d2a"


def parsed(path: Path) -> list[dict[str, Any]]:
    """Every non-empty line of a process's output (stdout and stderr), each of which must be a JSON object."""
    lines = []
    for text in path.read_text().splitlines():
        if text.strip():
            try:
                line = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise AssertionError(f"{path.name}: not JSON: {text!r}") from None
            assert isinstance(line, dict) and {"ts", "level", "process", "pid", "msg"} <= set(line), text
            lines.append(line)
    return lines


def test_every_line_of_every_process_is_a_json_object(stack, redis_client, store) -> None:
    auth = setup(stack, redis_client)
    stack.start_provider(delay=0.1)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    job_id = submit(stack, auth)
    status, _, _ = stack.api("GET", f"/v1/jobs/{job_id}?probe={CANARY}", **auth)
    assert status == 200
    wait_until(lambda: finished(store, job_id), timeout=40)
    assert store.job(job_id)["state"] == "completed"
    hrefs = [output["href"] for output in orjson.loads(stack.api("GET", f"/v1/jobs/{job_id}", **auth)[2])["outputs"]]
    assert [stack.api("GET", href, **auth)[0] for href in hrefs] == [200, 200]
    stack.stop()  # every process flushes its log
    logs = {path.stem: parsed(path) for path in stack.logs.iterdir() if path.suffix == ".log"}
    assert sorted(logs) == ["provider", "sweeper", "watcher", "web", "worker"]
    names = {"provider": "sim", "sweeper": "sweeper", "watcher": "watcher", "web": "web", "worker": "worker"}
    assert {name: {line["process"] for line in lines} for name, lines in logs.items()} == {
        name: {process} for name, process in names.items()}
    messages = {name: [line["msg"] for line in lines] for name, lines in logs.items()}
    assert f"simulated ComfyUI on http://127.0.0.1:{stack.sim_port}" in messages["provider"]
    assert f"Dramatiq {dramatiq.__version__!r} is booting up." in messages["worker"]  # Dramatiq's main process
    assert "Worker process is ready for action." in messages["worker"]  # and its worker process
    assert any(m.startswith("watching ") for m in messages["watcher"])
    assert any(m.startswith("sweeping every ") for m in messages["sweeper"])
    changes = sorted((x["ts"], x["from"], x["to"], x["reason"], x["attempt"], x["generation"])
                     for lines in logs.values() for x in lines if x["logger"] == "reckon.state" and x["job"] == job_id)
    assert [change[1:5] for change in changes] == [  # every state change of the job, where it happened
        ("", "queued", "admitted", 0), ("queued", "running", "claimed", 1), ("running", "completed", "completed", 1)]
    assert changes[1][5] == 1 and changes[2][5] == int(store.job(job_id)["lease_gen"]) - 1  # the generation held
    assert {x["process"] for lines in logs.values() for x in lines if x["logger"] == "reckon.state"} == {
        "web", "worker", "watcher"}  # the watcher collects: the completion is its line
    access = [(x["method"], x["path"], x["status"]) for x in logs["web"] if x["logger"] == "gunicorn.access"]
    assert ("POST", "/v1/jobs", 202) in access and ("GET", f"/v1/jobs/{job_id}", 200) in access
    assert access.count(("GET", OUTPUT_ROUTE, 200)) == 2
    everything = "".join(path.read_text() for path in stack.logs.iterdir())
    for private in (CANARY, auth["Authorization"].split()[1], *hrefs):
        assert private not in everything
