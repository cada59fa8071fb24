"""Routing by what a server can run, against the real ComfyUI: what it offers is read from its own
``/object_info`` and ``/models/<folder>``, and admission refuses a workflow it cannot run."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.errors import UnsupportedWorkflow
from pipeline.needs import FOLDERS
from pipeline.providers import sim as simulated
from pipeline.state import keys, offers
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.broker import Publisher
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import empty, save
from tests.conftest import wait_until
from tests.pipeline.conftest import InProcess


def test_the_adapter_reads_the_node_classes_and_model_folders_of_a_real_comfyui(comfyui: RealComfyUI) -> None:
    offer = comfyui.adapter().offers()
    assert offer is not None
    assert offer.nodes == set(comfyui.get("/object_info"))  # every class it has, read apart
    assert {"EmptyImage", "SaveImage", "ImageBlur", "CheckpointLoaderSimple"} <= offer.nodes
    assert set(offer.models) == set(FOLDERS) & set(comfyui.get("/models"))
    assert offer.models["checkpoints"] == set(comfyui.get("/models/checkpoints"))  # no weights here: empty


def test_jobs_go_to_the_real_comfyui_only_when_it_has_their_nodes(store, settings, broker, comfyui) -> None:
    """Beside a simulated server that offers every node of the graph but not the real one's: each
    job goes where its nodes are, and a job neither has is refused with nothing reserved."""
    fake = simulated.start(nodes=["FakeSampler", "SaveImage"], models={})
    try:
        create_tenant(store.redis, "acme", 10**6)
        with InProcess(store, settings, broker, {"gpu": comfyui, "sim": fake}):
            wait_until(lambda: all(store.redis.exists(keys.server_offers(n)) for n in ("gpu", "sim")), timeout=20)
            fleet = f"gpu={comfyui.url};cap=2,sim={fake.url};cap=2"
            admitter = Admitter(store, Publisher(broker), dataclasses.replace(settings, providers=fleet))
            real = {"1": empty(comfyui.color()), "9": save("1", "routed")}
            simulated_only = {"1": {"class_type": "FakeSampler", "inputs": {}}, "9": save("1", "x")}
            to_real = admitter.submit("acme", "r", {"kind": "image", "workflow": real, "outputs": 1}).job_id
            to_sim = admitter.submit("acme", "s", {"kind": "image", "workflow": simulated_only, "outputs": 1}).job_id
            with pytest.raises(UnsupportedWorkflow) as refused:
                admitter.submit("acme", "n", {"kind": "image", "outputs": 1, "workflow": {
                    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
                    "2": {"class_type": "NoSuchNode", "inputs": {}}}})
            wait_until(lambda: {store.job(j)["state"] for j in (to_real, to_sim)} == {"completed"}, timeout=60)
        assert refused.value.nodes == ("NoSuchNode",)  # the real one has the loader, not the file
        assert refused.value.models == ("checkpoints/sd15.safetensors",)
        assert [a["server"] for a in store.attempts(to_real)] == ["gpu"]
        assert [a["server"] for a in store.attempts(to_sim)] == ["sim"]
        windows, _ = keys.TenantKeys("acme").idempotency_windows(None, 24 * 3600)
        assert not any(store.redis.hexists(w, "n") for w in windows)
        assert len(fake.sim.charges) == 1
    finally:
        fake.close()


def test_what_a_server_offers_is_stored_without_its_answers_beyond_names(comfyui: RealComfyUI, store) -> None:
    offers.write(store.redis, "gpu", comfyui.adapter().offers(), 1)
    stored = offers.read(store.redis, ["gpu", "other"])
    assert stored["other"] is None and stored["gpu"] == comfyui.adapter().offers()
    assert len(store.redis.get(keys.server_offers("gpu"))) < 40_000  # names only, not /object_info's 500 kB
