"""An uploaded input is its tenant's alone, against the real ComfyUI stack (issue 31 section 4): a second
tenant whose workflow names the first tenant's input is refused at admission (422 input-unknown), and
nothing reaches ComfyUI: no prompt in its history, none executed, no file in its input folder. The same
stack then runs that tenant's own job: the refusal was admission's, not a stack that sends nothing."""

from __future__ import annotations

import os
from pathlib import Path

from falcon import testing

from api.app import create_app
from pipeline.state.keys import TenantKeys
from pipeline.work.broker import Publisher
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import empty, save
from tests.comfyui.test_end_to_end import ended, stack  # noqa: F401 - the stack fixture
from tests.conftest import wait_until


def test_a_second_tenant_naming_the_first_tenants_input_is_refused_and_nothing_reaches_comfyui(
        store, settings, broker, tenant, stack, comfyui: RealComfyUI) -> None:
    api = testing.TestClient(create_app(settings, store=store, publish=Publisher(broker)))
    owner, other = tenant("acme"), tenant("other")
    png = b"\x89PNG\r\n\x1a\n" + os.urandom(64)  # bytes no other test uploads: its name is this test's alone
    uploaded = api.simulate_post("/v1/inputs", body=png, headers={
        "Authorization": f"Bearer {owner}", "Content-Type": "image/png"})
    assert uploaded.status_code == 201
    name = uploaded.json["name"]
    history, logged = len(comfyui.get("/history")), comfyui.executions()
    refused = api.simulate_post("/v1/jobs", headers={"Authorization": f"Bearer {other}", "Idempotency-Key": "k"},
                                json={"kind": "image", "outputs": 1, "workflow": {
                                    "1": {"class_type": "LoadImage", "inputs": {"image": name}},
                                    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
                                    "9": save("2", "scope")}})
    assert (refused.status_code, refused.json["type"], refused.json["names"]) == (
        422, "urn:reckon:problem:input-unknown", [name])
    assert store.redis.zcard(TenantKeys("other").jobs) == 0 and store.ledger("other")["reserved"] == 0
    own = api.simulate_post("/v1/jobs", headers={"Authorization": f"Bearer {other}", "Idempotency-Key": "own"},
                            json={"kind": "image", "outputs": 1,
                                  "workflow": {"1": empty(comfyui.color()), "9": save("1", "scope-own")}})
    assert ended(store, own.json["id"])["state"] == "completed"
    wait_until(lambda: comfyui.executions() > logged)
    assert (len(comfyui.get("/history")), comfyui.executions()) == (history + 1, logged + 1)  # its own job only
    assert not (comfyui.directory / "ComfyUI" / "input" / Path(name)).exists()
