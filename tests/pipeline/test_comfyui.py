"""The ComfyUI adapter against the simulated ComfyUI, over real loopback HTTP."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.errors import InvalidInput, Transient
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from tests.conftest import wait_until


def adapter(server: simulated.SimServer) -> ComfyUI:
    return ComfyUI(HttpTransport(server.url, timeout=5), price_per_output=10)


def test_submit_then_status_by_our_operation_id() -> None:
    server = simulated.start(delay=0.3)
    try:
        comfy = adapter(server)
        assert comfy.status("op-1").state == "unknown"
        comfy.submit("op-1", {"3": {"class_type": "KSampler"}}, [0, 2])
        comfy.submit("op-2", {"3": {"class_type": "KSampler"}}, [0])
        assert {comfy.status("op-1").state, comfy.status("op-2").state} == {"running", "pending"}
        wait_until(lambda: comfy.status("op-1").state == "completed")
        done = comfy.status("op-1")
        assert [ref.index for ref in done.outputs] == [0, 2]
        data = [comfy.fetch(ref) for ref in done.outputs]
        assert len({hashlib.sha256(d).hexdigest() for d in data}) == 2
        wait_until(lambda: comfy.status("op-2").state == "completed")
        assert [c["prompt_id"] for c in server.sim.charges] == ["op-1", "op-2"]
    finally:
        server.close()


def test_rejected_prompt_and_dead_provider_are_classified(sim) -> None:
    with pytest.raises(InvalidInput):
        adapter(sim).submit("op-1", {}, [0])
    assert sim.sim.charges == []
    closed = simulated.start()
    closed.close()
    with pytest.raises(Transient):
        adapter(closed).submit("op-2", {"1": {}}, [0])
