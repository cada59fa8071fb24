"""The slot is the GPU (docs/fleet.md "The slot is the GPU"): a server's slot is free the moment its prompt
ends there (the watcher hears it), not once reckon has collected the outputs, stored them and settled;
the job parked for it is called at once, the cap still holds, and no slot is given back twice. Against
the simulated ComfyUI (one prompt at a time, as ComfyUI runs them) at cap 1, with one shard and with two
(a server's cap across shards: its own slot key)."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.progress import record
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.dispatch import LocalDispatch
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from pipeline.work.watcher import ServerWatch
from tests.conftest import wait_until
from tests.pipeline.test_failures import inject

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


@pytest.fixture
def sim() -> Iterator[simulated.SimServer]:
    server = simulated.start(price_per_output=10)
    server.sim.delay = 0.2
    yield server
    server.close()


@pytest.fixture(params=[1, 2])
def sharded(request, redis_client) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    keys.use_shards(request.param)
    try:
        yield Store(redis_client, shards=request.param)
    finally:
        keys.use_shards(1)


def stack(store: Store, settings: Settings, url: str, *keys_: str) -> tuple[Settings, Fleet, Executor, list[str]]:
    """Watch-mode settings for one simulated server at cap 1, its fleet and executor, and a job of tenant
    acme admitted for each idempotency key of ``keys_``."""
    settings = dataclasses.replace(settings, watch=True, providers=f"sim={url};cap=1;price=10")
    fleet = Fleet(settings.servers(), lambda s: ComfyUI(HttpTransport(s.url, timeout=5), price_per_output=10))
    create_tenant(store.redis, "acme", 10_000)
    admit = Admitter(store, lambda job_id, priority: None, settings)
    jobs = [admit.submit("acme", key, {"kind": "image", "workflow": WORKFLOW, "outputs": 1}).job_id for key in keys_]
    return settings, fleet, Executor(store, fleet, BlobStore(settings.blob_dir), settings), jobs


def busy(store: Store) -> int:
    """The server's slots taken by attempts: every shard's count, and (with shards) its own slot key's
    (where an unpark's call reserves a slot too: ``<job id>/call``)."""
    counts = sum(int(store.redis.hget(shard.fleet, "busy:sim") or 0) for shard in keys.shards())
    if store.slots.on:
        held = [m for m in store.redis.zrange(keys.server_slots("sim"), 0, -1) if not m.endswith("/call")]
        assert len(held) == counts, (held, counts)
    return counts


def test_the_slot_frees_when_the_prompt_ends_and_the_parked_job_is_called_at_once(
        sharded: Store, settings, sim) -> None:
    store = sharded
    settings, fleet, executor, (first, second) = stack(store, settings, sim.url, "first", "second")
    published: list[tuple[str, str]] = []
    watch = ServerWatch("sim", fleet, store, lambda job, why: published.append((job, why)), settings,
                        lambda *point: record(store.scripts, *point), lambda: 1000.0)
    assert executor.run(first)  # submitted, handed over to the watcher
    assert not executor.run(second)  # no free slot: parked
    assert (store.job(second)["state"], busy(store)) == ("queued", 1)
    entry = store.watch_entry(first)
    wait_until(lambda: sim.sim.charges)  # the prompt ended at the server

    def end() -> None:  # ComfyUI's last word on a prompt, once it left its queue
        watch.on_message(orjson.dumps({"type": "executing", "data": {"node": None,
                                                                     "prompt_id": entry["op"]}}).decode())
    end()
    # free before anything was collected: the first job still runs, its outputs unread; the second is called
    assert store.job(first)["state"] == "running" and store.watch_entry(first) is not None
    assert busy(store) == 0
    assert published == [(second, "unparked"), (first, "collect")]
    end()  # the same end heard twice (websocket, then /history): nothing more is given back or called
    assert busy(store) == 0 and published[2:] == [(first, "collect")]
    assert executor.run(second)  # takes the freed slot and sends, while the first is not yet collected
    assert busy(store) == 1
    wait_until(lambda: len(sim.sim.charges) == 2)
    assert executor.collect(first)  # the first job's outputs stored, settled: its slot is not given back again
    assert (store.job(first)["state"], busy(store)) == ("completed", 1)
    assert executor.collect(second)  # its end not heard here: its collect's finish gives its slot back
    assert (store.job(second)["state"], busy(store)) == ("completed", 0)


def test_a_job_called_to_the_freed_slot_is_sent_from_the_watchers_process_without_the_broker(
        store: Store, settings, sim) -> None:
    """The watcher's dispatch (pipeline/work/dispatch.py) claims and sends the called job itself: with no
    worker at all, the second job reaches the server once the first one's end is heard; a collect still
    goes to the broker; and a called job that fails is routed as a worker routes it."""
    settings, fleet, executor, (first, second) = stack(store, settings, sim.url, "first", "second")
    brokered: list[tuple[str, str]] = []
    dispatch = LocalDispatch(lambda: executor, lambda: Router(store, settings), lambda *m: brokered.append(m), 2)
    watch = ServerWatch("sim", fleet, store, dispatch, settings, lambda *point: record(store.scripts, *point),
                        lambda: 1000.0)
    try:
        assert executor.run(first) and not executor.run(second)
        op = store.watch_entry(first)["op"]
        wait_until(lambda: sim.sim.charges)
        watch.on_message(orjson.dumps({"type": "executing", "data": {"node": None, "prompt_id": op}}).decode())
        assert brokered == [(first, "collect")]  # only the collect crossed the broker
        wait_until(lambda: store.watch_entry(second) is not None)  # claimed, sent and handed over here
        wait_until(lambda: len(sim.sim.charges) == 2)
        assert [c["prompt_id"] for c in sim.sim.charges] == [op, store.watch_entry(second)["op"]]
        assert busy(store) == 1
    finally:
        dispatch.close()


def test_a_called_job_that_fails_in_the_watchers_process_is_routed(store: Store, settings, sim) -> None:
    """The called job's prompt goes out and the server's answer is lost: its outcome is unknown, and the
    job goes to reconciliation, as a worker's failure is routed (never dropped, never sent again blindly)."""
    settings, _, executor, (job,) = stack(store, settings, sim.url, "lost")
    inject(sim, {"kind": "error_after"})
    dispatch = LocalDispatch(lambda: executor, lambda: Router(store, settings), lambda *m: None, 1)
    try:
        dispatch(job, "unparked")
    finally:
        dispatch.close()  # waits for the run
    assert (store.job(job)["state"], store.job(job)["attempt_count"]) == ("reconciling", "1")
