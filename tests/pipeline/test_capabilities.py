"""Routing by what a server can run (pipeline/needs.py, pipeline/state/offers.py, lua/claim.lua,
lua/unpark.lua): simulated servers with different node classes and models, the real admission and
claim scripts on a real redis-server, and a whole in-process stack in watch mode."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.errors import UnsupportedWorkflow
from pipeline.needs import Offer, needs_of
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state import keys, offers
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.broker import Publisher
from tests.conftest import wait_until
from tests.pipeline.conftest import InProcess

SDXL = {"checkpoints": ["sdxl.safetensors"], "loras": ["ink.safetensors"]}
FLUX = {"checkpoints": ["flux.safetensors"]}
NODES = ["CheckpointLoaderSimple", "LoraLoader", "KSampler", "SaveImage"]


def workflow(checkpoint: str = "sdxl.safetensors", *extra: str, lora: str | None = None) -> dict[str, Any]:
    graph: dict[str, Any] = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
                             "3": {"class_type": "KSampler", "inputs": {"seed": 1, "model": ["1", 0]}},
                             "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}
    if lora:
        graph["2"] = {"class_type": "LoraLoader", "inputs": {"lora_name": lora, "model": ["1", 0]}}
    for n, cls in enumerate(extra):
        graph[f"x{n}"] = {"class_type": cls, "inputs": {}}
    return graph


def body(graph: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"kind": "image", "workflow": graph, "outputs": 1, **more}


def test_a_workflow_needs_its_node_classes_and_the_files_its_loaders_name() -> None:
    graph = workflow("b.safetensors", "Upscale", lora="ink.safetensors")
    graph["0"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}}
    graph["4"] = {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "vit.safetensors"}}
    graph["5"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "x4.pth"}}
    graph["6"] = {"class_type": "KSampler", "inputs": {"sampler_name": "euler"}}  # not a model input
    needs = needs_of(graph)
    assert needs.nodes == {"CheckpointLoaderSimple", "KSampler", "SaveImage", "LoraLoader", "Upscale",
                           "CLIPVisionLoader", "UpscaleModelLoader"}
    assert needs.models == {("checkpoints", "a.safetensors"), ("checkpoints", "b.safetensors"),
                            ("loras", "ink.safetensors"), ("clip_vision", "vit.safetensors"),
                            ("upscale_models", "x4.pth")}
    assert needs.checkpoint == "a.safetensors"  # the first node's, by id


def test_the_adapter_reads_what_a_server_offers_and_none_from_a_server_that_does_not_say() -> None:
    told, silent = simulated.start(nodes=NODES, models=SDXL), simulated.start()
    try:
        offer = ComfyUI(HttpTransport(told.url, timeout=5), price_per_output=10).offers()
        assert offer == Offer(frozenset(NODES), {"checkpoints": frozenset({"sdxl.safetensors"}),
                                                 "loras": frozenset({"ink.safetensors"})})
        assert ComfyUI(HttpTransport(silent.url, timeout=5), price_per_output=10).offers() is None
    finally:
        told.close()
        silent.close()


@pytest.fixture
def fleet_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, providers="a=http://127.0.0.1:9;cap=1;price=30,b=http://127.0.0.1:9;cap=1;price=10")


def offer(nodes: list[str], models: dict[str, list[str]]) -> Offer:
    return Offer(frozenset(nodes), {k: frozenset(v) for k, v in models.items()})


def test_admission_refuses_what_no_server_can_run_and_reserves_nothing(store: Store, fleet_settings: Settings) -> None:
    create_tenant(store.redis, "acme", 1000)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES[:3], FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    before = sorted(store.redis.keys("*"))
    with pytest.raises(UnsupportedWorkflow) as refused:
        admitter.submit("acme", "k1", body(workflow("sd15.safetensors", "Magic")))
    assert (refused.value.nodes, refused.value.models) == (("Magic",), ("checkpoints/sd15.safetensors",))
    assert refused.value.problem == "unsupported-workflow" and "Magic" in refused.value.detail
    assert sorted(store.redis.keys("*")) == before  # nothing reserved, no job, the key stays free
    # only a can run it: the job may run there alone, and is reserved at a's price
    job_id = admitter.submit("acme", "k2", body(workflow(lora="ink.safetensors"))).job_id
    job = store.job(job_id)
    assert (job["servers"], job["price"], job["reserved"]) == ("a", "30", str(int(job["ceiling"])))
    assert int(job["ceiling"]) % 30 == 0
    # every server can run it: no servers field, the highest price
    offers.write(store.redis, "b", offer(NODES, SDXL), 2)
    admitter.routes.ttl = 0
    both = store.job(admitter.submit("acme", "k3", body(workflow())).job_id)
    assert "servers" not in both and both["price"] == "30"
    # a retry of an admitted request replays, whatever the servers offer now
    offers.write(store.redis, "a", offer([], {}), 3)
    assert admitter.submit("acme", "k2", body(workflow(lora="ink.safetensors"))).replayed is True


CAPS = {"a": 1, "b": 1}


def claim(store: Store, job_id: str) -> Any:
    return store.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{job_id}", servers=CAPS)


def test_a_claim_takes_a_slot_only_on_a_server_that_can_run_the_job(store: Store, fleet_settings: Settings) -> None:
    create_tenant(store.redis, "acme", 10**6)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    flux = [admitter.submit("acme", f"f{n}", body(workflow("flux.safetensors"))).job_id for n in range(2)]
    sdxl = admitter.submit("acme", "s0", body(workflow("sdxl.safetensors"), priority="batch")).job_id
    first = claim(store, flux[0])
    assert first.server == "b"  # a is as free; only b has the checkpoint
    assert claim(store, flux[1]) is None  # b is full; a's free slot is not its
    fleet = keys.ShardKeys(0).fleet
    assert store.redis.hget(fleet, f"p:{flux[1]}").startswith("b|")  # parked with its servers, for unpark
    assert claim(store, sdxl).server == "a"  # the flux job parked ahead could not use a's free slot
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # b is full: the flux job waits for it
    store.finish(first, "cancelled", reason="cancelled")
    assert store.unpark(keys.ShardKeys(0), CAPS) == [flux[1]]
    assert claim(store, flux[1]).server == "b"
    assert store.redis.hget(fleet, f"p:{flux[1]}") is None


def test_unpark_passes_over_a_job_whose_servers_are_full_and_calls_the_next(
        store: Store, fleet_settings: Settings) -> None:
    create_tenant(store.redis, "acme", 10**6)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    submit = lambda key, ckpt: admitter.submit("acme", key, body(workflow(ckpt))).job_id  # noqa: E731
    on_a, on_b = claim(store, submit("s0", "sdxl.safetensors")), claim(store, submit("f0", "flux.safetensors"))
    waiting_b = submit("f1", "flux.safetensors")
    waiting_a = submit("s1", "sdxl.safetensors")
    assert claim(store, waiting_b) is None and claim(store, waiting_a) is None
    store.finish(on_a, "cancelled", reason="cancelled")  # a frees: the flux job ahead cannot use it
    assert store.unpark(keys.ShardKeys(0), CAPS) == [waiting_a]
    assert claim(store, waiting_a).server == "a"
    store.finish(on_b, "cancelled", reason="cancelled")
    assert store.unpark(keys.ShardKeys(0), CAPS) == [waiting_b]
    store.cancel(waiting_b)  # called, then cancelled before it claims: its servers go with it
    assert store.redis.hget(keys.ShardKeys(0).fleet, f"p:{waiting_b}") is None


def test_a_claim_prefers_the_server_that_last_took_the_same_checkpoint(store: Store, settings: Settings) -> None:
    create_tenant(store.redis, "acme", 10**6)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    caps = {"a": 2, "b": 2}
    take = lambda key, ckpt: store.claim(  # noqa: E731
        admitter.submit("acme", key, body(workflow(ckpt))).job_id, worker="w", lease_ms=60_000,
        operation_id=key, servers=caps)
    servers = [take("1", "x.safetensors").server, take("2", "y.safetensors").server]
    assert sorted(servers) == ["a", "b"]  # equal loads: one each
    assert take("3", "x.safetensors").server == servers[0]  # warm, though as loaded as the other
    assert take("4", "y.safetensors").server == servers[1]
    assert take("5", "x.safetensors") is None  # both full


def test_a_whole_stack_routes_each_job_to_a_server_that_can_run_it(
        store: Store, settings: Settings, broker) -> None:
    sdxl, flux = simulated.start(nodes=NODES, models=SDXL), simulated.start(nodes=NODES, models=FLUX)
    try:
        create_tenant(store.redis, "acme", 10**6)
        fleet = f"a={sdxl.url};cap=2,b={flux.url};cap=2"
        with InProcess(store, settings, broker, {"a": sdxl, "b": flux}):
            wait_until(lambda: all(store.redis.exists(keys.server_offers(n)) for n in "ab"), timeout=10)
            admitter = Admitter(store, Publisher(broker), dataclasses.replace(settings, providers=fleet))
            jobs = {admitter.submit("acme", f"k{n}", body(workflow(ckpt))).job_id: ckpt
                    for n, ckpt in enumerate(["sdxl.safetensors", "flux.safetensors"] * 4)}
            with pytest.raises(UnsupportedWorkflow):
                admitter.submit("acme", "no", body(workflow("sd15.safetensors")))
            wait_until(lambda: all(store.job(j)["state"] == "completed" for j in jobs), timeout=30)
        for job_id, ckpt in jobs.items():
            assert [a["server"] for a in store.attempts(job_id)] == ["a" if ckpt.startswith("sdxl") else "b"]
        assert (len(sdxl.sim.charges), len(flux.sim.charges)) == (4, 4)
    finally:
        sdxl.close()
        flux.close()
