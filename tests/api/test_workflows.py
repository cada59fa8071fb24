"""Saved workflows over HTTP and in admission: save, versions, a job naming one, its parameters refused by
name, its fingerprint, tenants kept apart; against a real redis-server and a Redis Cluster."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from falcon import testing

from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.store import Store
from pipeline.state.workflows import SHARED, Workflows

from tests.inputs import upload

from .conftest import auth

BOTH_BACKENDS = True

P = "urn:reckon:problem:"
GRAPH = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 5, "steps": 20, "model": ["4", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a saved prompt", "clip": ["4", 1]}},
}
#: GRAPH with an image to load: an uploaded input a request names.
RESTYLE = {**GRAPH, "10": {"class_type": "LoadImage", "inputs": {"image": "reckon/" + "0" * 64 + ".png"}}}
PARAMS = {
    "prompt": {"node": "6", "input": "text", "type": "string", "max_length": 20, "required": True},
    "seed": {"node": "3", "input": "seed", "type": "integer", "minimum": 0, "maximum": 2**53, "default": 7},
    "steps": {"node": "3", "input": "steps", "type": "integer", "minimum": 1, "maximum": 50},
}
IMAGE = {"node": "10", "input": "image", "type": "input", "required": True}


def ref_body(ref: str = "portrait", **params: Any) -> dict[str, Any]:
    return {"kind": "image", "workflow_ref": ref, "params": params, "outputs": 1}


def post(client: testing.TestClient, key: str, body: Any, idem: str = "k1") -> testing.Result:
    return client.simulate_post("/v1/jobs", json=body, headers=auth(key) | {"Idempotency-Key": idem})


def sent_graph(store: Store, job_id: str) -> dict[str, Any]:
    return orjson.loads(store.redis.get(JobKeys(job_id).workflow))


@pytest.fixture
def shared(store: Store, settings) -> Workflows:
    """The operator's ``portrait``, saved for every tenant (version 1)."""
    saved = Workflows(store.redis, store.scripts, settings)
    saved.save(SHARED, "portrait", GRAPH, PARAMS)
    return saved


def test_a_job_naming_a_saved_workflow_runs_its_graph_with_the_params_set(client, tenant, store, shared,
                                                                         settings) -> None:
    key = tenant()
    resp = post(client, key, ref_body(prompt="a cat", steps=30))
    assert resp.status_code == 202, resp.json
    job_id = resp.json["id"]
    graph = sent_graph(store, job_id)
    assert graph["6"]["inputs"] == {"text": "a cat", "clip": ["4", 1]}
    assert graph["3"]["inputs"] == {"seed": 7, "steps": 30, "model": ["4", 0]}  # the default seed
    null = post(client, key, ref_body(prompt="a cat", seed=None), idem="k-null")  # null: as if left out
    assert sent_graph(store, null.json["id"])["3"]["inputs"]["seed"] == 7
    assert graph["4"] == GRAPH["4"]  # not a parameter: as saved
    assert store.redis.hget(JobKeys(job_id).record, "workflow_ref") == "portrait@1"
    assert shared.resolve("acme", "portrait@1").graph["6"]["inputs"]["text"] == "a saved prompt"  # unchanged
    shared.save(SHARED, "restyle", RESTYLE, {"image": IMAGE})
    name = upload(store, settings, b"\x89PNG\r\n\x1a\n image bytes")
    restyled = post(client, key, ref_body("restyle", image=name), idem="k2")
    assert restyled.json["inputs"] == [{"sha256": name[7:71]}]
    assert sent_graph(store, restyled.json["id"])["10"]["inputs"] == {"image": name}
    stranger = post(client, key, ref_body("restyle", image="reckon/" + "1" * 64 + ".png"), idem="k3")
    assert (stranger.status_code, stranger.json["type"]) == (422, P + "input-unknown")


def test_each_bad_parameter_is_named_in_one_422_and_nothing_is_written(client, tenant, store, shared) -> None:
    key = tenant()
    resp = post(client, key, ref_body(seed=-1, steps="many", colour="red"))
    assert resp.status_code == 422
    assert resp.json["type"] == P + "invalid-params"
    reasons = {p["name"]: p["reason"].split(":")[0] for p in resp.json["params"]}
    assert reasons == {"colour": "unknown", "prompt": "missing", "seed": "out of bounds", "steps": "wrong type"}
    shared.save(SHARED, "restyle", RESTYLE, {"image": IMAGE})
    path = post(client, key, ref_body("restyle", image="../etc/passwd"))
    assert [p["name"] for p in path.json["params"]] == ["image"]
    too_long = post(client, key, ref_body(prompt="x" * 21))
    assert too_long.json["params"] == [{"name": "prompt", "reason": "out of bounds: must be from - to 20 characters"}]
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0
    assert store.ledger("acme")["reserved"] == 0


def test_an_unknown_ref_is_refused(client, tenant, store, shared) -> None:
    key = tenant()
    for ref in ("nothing", "portrait@2", "Bad Name", 5):
        resp = post(client, key, ref_body(ref, prompt="a cat"))
        assert (resp.status_code, resp.json["type"]) == (422, P + "workflow-not-found"), ref
    both = post(client, key, ref_body(prompt="a cat") | {"workflow": GRAPH})
    assert (both.status_code, both.json["field"]) == (422, "workflow")
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0


def test_versions_are_immutable_and_the_name_alone_is_the_latest(client, tenant, store, shared, settings) -> None:
    key = tenant()
    changed = {**GRAPH, "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "v2", "clip": ["4", 1]}}}
    assert shared.save(SHARED, "portrait", changed, {})[0].version == 2
    assert shared.save(SHARED, "portrait", changed, {})[0].version == 2  # the same again: no new version
    assert client.simulate_get("/v1/workflows/portrait@1", headers=auth(key)).json["params"]["prompt"]["max_length"] == 20
    assert client.simulate_get("/v1/workflows/portrait", headers=auth(key)).json["version"] == 2
    pinned = post(client, key, ref_body("portrait@1", prompt="a cat"), idem="pinned")
    latest = post(client, key, ref_body("portrait"), idem="latest")
    assert sent_graph(store, pinned.json["id"])["6"]["inputs"]["text"] == "a cat"
    assert sent_graph(store, latest.json["id"])["6"]["inputs"]["text"] == "v2"
    fresh = Workflows(store.redis, store.scripts, settings)  # another process: read from Redis
    assert fresh.resolve("acme", "portrait@1").params == shared.resolve("acme", "portrait@1").params


def test_fingerprint_same_params_replay_other_params_refused(client, tenant, store, shared) -> None:
    key = tenant()
    first = post(client, key, ref_body("portrait@1", prompt="a cat"))
    again = post(client, key, ref_body("portrait@1", prompt="a cat"))
    assert (again.status_code, again.headers["Idempotent-Replayed"], again.json["id"]) == \
        (202, "true", first.json["id"])
    named = post(client, key, ref_body("portrait", prompt="a cat"))  # resolves to the same version: replays
    assert named.json["id"] == first.json["id"]
    other = post(client, key, ref_body("portrait@1", prompt="a dog"))
    assert (other.status_code, other.json["type"]) == (422, P + "idempotency-key-reused")
    assert shared.save(SHARED, "portrait", GRAPH, PARAMS | {"steps": PARAMS["steps"] | {"maximum": 40}})[1]
    # version 2: `portrait` is no longer what the key ran
    moved = post(client, key, ref_body("portrait", prompt="a cat"))
    assert (moved.status_code, moved.json["type"]) == (422, P + "idempotency-key-reused")
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1


def test_a_tenant_saves_its_own_and_no_other_tenant_sees_it(client, tenant, store, shared) -> None:
    acme, umbrella = tenant("acme"), tenant("umbrella")
    saved = client.simulate_post("/v1/workflows", headers=auth(acme),
                                 json={"name": "mine", "workflow": GRAPH, "params": {"prompt": PARAMS["prompt"]}})
    assert (saved.status_code, saved.headers["Location"], saved.json["version"]) == (201, "/v1/workflows/mine@1", 1)
    assert saved.json["needs"] == {"node_classes": ["CLIPTextEncode", "CheckpointLoaderSimple", "KSampler"],
                                   "models": ["checkpoints/sd15.safetensors"]}
    again = client.simulate_post("/v1/workflows", headers=auth(acme),
                                 json={"name": "mine", "workflow": GRAPH, "params": {"prompt": PARAMS["prompt"]}})
    assert (again.status_code, again.json) == (200, saved.json)  # a retried save: the same version
    assert client.simulate_get("/v1/workflows/mine", headers=auth(acme)).json["workflow"] == GRAPH
    assert "workflow" not in client.simulate_get("/v1/workflows/portrait", headers=auth(acme)).json  # shared
    assert client.simulate_get("/v1/workflows", headers=auth(acme)).json == {"workflows": [
        {"name": "mine", "owner": "tenant", "latest": 1}, {"name": "portrait", "owner": "shared", "latest": 1}]}
    assert client.simulate_get("/v1/workflows", headers=auth(umbrella)).json == {"workflows": [
        {"name": "portrait", "owner": "shared", "latest": 1}]}
    for ref in ("mine", "mine@1"):
        hidden = client.simulate_get(f"/v1/workflows/{ref}", headers=auth(umbrella))
        assert (hidden.status_code, hidden.json["type"]) == (404, P + "workflow-not-found")
        refused = post(client, umbrella, ref_body(ref, prompt="a cat"), idem=ref.replace("@", "-"))
        assert (refused.status_code, refused.json["type"]) == (422, P + "workflow-not-found")
    taken = client.simulate_post("/v1/workflows", headers=auth(acme),
                                 json={"name": "portrait", "workflow": GRAPH})
    assert (taken.status_code, taken.json["type"]) == (409, P + "workflow-name-taken")
    assert shared.resolve("acme", "portrait").version == 1


@pytest.mark.parametrize(("params", "field"), [
    ({"p": {"node": "99", "input": "text", "type": "string"}}, "params.p"),
    ({"p": {"node": "6", "input": "nope", "type": "string"}}, "params.p"),
    ({"p": {"node": "4", "input": "ckpt_name", "type": "string"}}, "params.p"),  # a model: needs would vary
    ({"p": {"node": "3", "input": "model", "type": "string"}}, "params.p"),  # a link
    ({"p": {"node": "3", "input": "seed", "type": "integer", "default": "x"}}, "params.p"),
    ({"p": {"node": "3", "input": "seed", "type": "float"}}, "params.p"),
    ({"p": PARAMS["seed"], "q": PARAMS["seed"]}, "params.q"),
    ({"p": {"node": "3", "input": "seed", "type": "integer", "minimum": 5, "maximum": 4}}, "params.p"),  # no value
    ({"p": {"node": "3", "input": "seed", "type": "integer", "required": True, "default": 1}}, "params.p"),
])
def test_saving_refuses_bad_parameters_and_writes_nothing(client, tenant, store, params, field) -> None:
    key = tenant()
    resp = client.simulate_post("/v1/workflows", headers=auth(key),
                                json={"name": "mine", "workflow": GRAPH, "params": params})
    assert (resp.status_code, resp.json["type"], resp.json["field"]) == (422, P + "invalid-workflow", field)
    assert client.simulate_get("/v1/workflows", headers=auth(key)).json == {"workflows": []}


def test_saving_refuses_a_graph_admission_would_refuse(client, tenant) -> None:
    key = tenant()
    for graph in ({}, [], "x"):
        resp = client.simulate_post("/v1/workflows", headers=auth(key), json={"name": "mine", "workflow": graph})
        assert (resp.status_code, resp.json["type"], resp.json["field"]) == (422, P + "invalid-workflow", "workflow")
