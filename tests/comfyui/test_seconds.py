"""Per-second prices against the real ComfyUI (docs/costs.md "Per-second prices"): an attempt is booked
by the seconds ComfyUI itself reports (its history's ``execution_start`` and ``execution_success``
timestamps), and a second identical prompt, which ComfyUI runs from its cache, books only what executed."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.blobs.local import BlobStore
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import empty, save

PRICE, PER_SECOND = 1, 10


def blurred(color: int, prefix: str) -> dict[str, Any]:
    """A 1024x1024 image through one wide blur: a second or two on this machine's CPU."""
    return {"1": empty(color, size=1024),
            "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 31, "sigma": 10.0}},
            "9": save("2", prefix)}


def own_ms(comfyui: RealComfyUI, operation_id: str) -> tuple[int, list[str]]:
    """The milliseconds between the run's start and success messages in ComfyUI's own history, read
    straight from the server, and the names of its messages."""
    messages = comfyui.get(f"/history/{operation_id}")[operation_id]["status"]["messages"]
    stamps = {name: data["timestamp"] for name, data in messages}
    return stamps["execution_success"] - stamps["execution_start"], [name for name, _ in messages]


def test_an_attempt_is_booked_by_comfyuis_own_seconds_and_a_cached_run_by_what_executed(
        store: Store, settings, comfyui: RealComfyUI) -> None:
    settings = dataclasses.replace(settings, providers=f"gpu={comfyui.url};price={PRICE};price_per_second={PER_SECOND}")
    fleet = Fleet(settings.servers(), lambda s: ComfyUI(HttpTransport(s.url, timeout=10),
                                                        price_per_output=s.price_per_output))
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    create_tenant(store.redis, "acme", 10_000)
    admit = Admitter(store, lambda job_id, priority: None, settings)
    workflow = blurred(comfyui.color(), f"seconds-{comfyui.color()}")
    jobs = [admit.submit("acme", key, {"kind": "image", "workflow": workflow, "outputs": 1, "max_seconds": 60}).job_id
            for key in ("ran", "cached")]
    assert store.job(jobs[0])["ceiling"] == str((PRICE + 60 * PER_SECOND) * 3)
    booked = []
    for job_id in jobs:
        assert executor.run(job_id)
        job, [run] = store.job(job_id), store.attempts(job_id)
        ms, messages = own_ms(comfyui, run["operation_id"])
        assert (job["state"], run["seconds_ms"]) == ("completed", ms)  # ComfyUI's own milliseconds
        assert job["settled"] == str(PRICE + -(-ms * PER_SECOND // 1000))
        booked.append((ms, messages))
    (ran, ran_messages), (cached, cached_messages) = booked
    assert ran >= 300 and "execution_cached" in ran_messages  # it executed the blur (EmptyImage may be cached)
    assert cached_messages == ["execution_start", "execution_cached", "execution_success"]
    assert cached < 100 < ran  # the cached run executed nothing: a few milliseconds
    ledger = store.ledger("acme")
    assert ledger["settled"] == sum(PRICE + -(-ms * PER_SECOND // 1000) for ms in (ran, cached))
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
