"""What a job naming a saved workflow costs in Redis commands, against one naming its graph: the same once
its version was read in this process (``name@version``), one more for ``name`` (the latest version's
number). A job with a plain workflow is untouched (tests/faults/test_budget.py pins it)."""

from __future__ import annotations

from typing import Any

from pipeline.state.workflows import SHARED, Workflows

from .conftest import auth, job_body

GRAPH = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}
PARAMS = {"seed": {"node": "3", "input": "seed", "type": "integer", "minimum": 0}}


def calls(client: Any) -> int:
    return sum(stat["calls"] for name, stat in client.info("commandstats").items() if name != "cmdstat_info")


def test_a_pinned_ref_costs_what_a_workflow_costs_and_the_latest_one_command_more(
        client, tenant, store, settings) -> None:
    key = tenant()
    Workflows(store.redis, store.scripts, settings).save(SHARED, "portrait", GRAPH, PARAMS)
    costs = {}
    bodies = {"workflow": job_body(workflow=GRAPH),
              "pinned": {"kind": "image", "outputs": 1, "workflow_ref": "portrait@1", "params": {"seed": 9}},
              "latest": {"kind": "image", "outputs": 1, "workflow_ref": "portrait", "params": {"seed": 9}}}
    for round_ in ("warm", "measured"):  # the first round reads the version (and the key, the offers) once
        for name, body in bodies.items():
            before = calls(store.redis)
            resp = client.simulate_post("/v1/jobs", json=body, headers=auth(key) | {"Idempotency-Key": f"{round_}-{name}"})
            costs[name] = calls(store.redis) - before
            assert resp.status_code == 202, resp.json
    assert costs["pinned"] == costs["workflow"]
    assert costs["latest"] == costs["workflow"] + 1
