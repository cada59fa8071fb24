"""A saved workflow end to end on a real stack (gunicorn, Dramatiq worker and watcher, simulated ComfyUI):
the operator saves it with ``reckon workflow save``, a job names it with parameters and completes with its
output, bad parameters are each named in one 422, and no parameter value reaches a log line."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import orjson

from reckon.client import Client
from tests.conftest import wait_until
from tests.faults.conftest import BIN, ROOT
from tests.faults.test_crashes import setup

GRAPH = {"3": {"class_type": "KSampler", "inputs": {"seed": 1, "text": "saved"}}}
PARAMS = {"prompt": {"node": "3", "input": "text", "type": "string", "max_length": 100, "required": True},
          "seed": {"node": "3", "input": "seed", "type": "integer", "minimum": 0, "maximum": 1000}}


def test_a_saved_workflow_runs_end_to_end_and_its_params_are_never_logged(stack, redis_client, store,
                                                                          tmp_path: Path) -> None:
    auth = setup(stack, redis_client)
    (tmp_path / "graph.json").write_bytes(orjson.dumps(GRAPH))
    (tmp_path / "params.json").write_bytes(orjson.dumps(PARAMS))
    saved = subprocess.run([str(BIN / "reckon"), "workflow", "save", "portrait", str(tmp_path / "graph.json"),
                            "--params", str(tmp_path / "params.json")],
                           cwd=ROOT, env=stack.env, capture_output=True, timeout=30)
    assert saved.returncode == 0, saved.stderr
    assert orjson.loads(saved.stdout)["ref"] == "portrait@1"
    stack.start_provider(delay=0.05)
    stack.start_web()
    stack.start_worker()
    canary = f"canary-{secrets.token_hex(8)}"
    body = {"kind": "image", "outputs": 1, "workflow_ref": "portrait", "params": {"prompt": canary, "seed": 5}}
    bad = body | {"params": {"seed": 1001, "colour": canary, canary: 1}}  # a name may be a prompt too
    status, _, answer = stack.api("POST", "/v1/jobs", bad, **auth, **{"Idempotency-Key": "bad"})
    assert status == 422
    assert [p["name"] for p in orjson.loads(answer)["params"]] == [canary, "colour", "prompt", "seed"]
    status, headers, _ = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "good"})
    assert status == 202
    job_id = headers["location"].rsplit("/", 1)[1]
    wait_until(lambda: (store.job(job_id) or {}).get("state") == "completed", timeout=30)
    status, _, output = stack.api("GET", f"/v1/jobs/{job_id}/outputs/0", **auth)
    assert status == 200 and output
    assert store.ledger("acme")["reserved"] == 0 and len(stack.charges()["charges"]) == 1  # ran and paid once
    client = Client(f"http://127.0.0.1:{stack.web_port}", auth["Authorization"].split()[1])
    mine = client.save_workflow("mine", GRAPH, {"seed": PARAMS["seed"]})
    assert client.save_workflow("mine", GRAPH, {"seed": PARAMS["seed"]}) == mine  # a retried save: one version
    assert client.workflows() == [{"name": "mine", "owner": "tenant", "latest": 1},
                                  {"name": "portrait", "owner": "shared", "latest": 1}]
    assert client.workflow("portrait@1")["params"]["prompt"]["max_length"] == 100
    job = client.submit("mine-1", {"kind": "image", "outputs": 1, "workflow_ref": mine["ref"], "params": {"seed": 9}})
    assert client.wait(job["id"], timeout=30)["state"] == "completed"
    stack.stop()  # flush every process's log
    logs = {path.name: path.read_text(errors="replace") for path in stack.logs.iterdir()}
    assert {"web.log", "worker.log"} <= set(logs)
    assert [name for name, text in logs.items() if canary in text] == []
