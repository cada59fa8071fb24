"""The bound on one prompt's execution holds whoever follows it (docs/costs.md "Per-second prices"): a
watcher that took over, or a new hand-over of the same prompt, keeps counting its ``max_seconds`` from
where they began, and a prompt reckon stopped at them fails ``max_seconds_exceeded`` on a server that
gives no timestamps too."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed
from pipeline.providers.base import OperationStatus
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.state.keys import JobKeys
from pipeline.state.progress import record
from pipeline.work.executor import Executor
from pipeline.work.watcher import ServerWatch
from tests.conftest import wait_until
from tests.pipeline.test_seconds import PRICE, Counting, balanced, parts, per_second, submit  # noqa: F401


class Untimed(ComfyUI):
    """The real adapter, as an older server answers: no execution timestamps in its history."""

    def status(self, operation_id: str) -> OperationStatus:
        return dataclasses.replace(super().status(operation_id), seconds_ms=None)


def watched(store, settings, per_second, max_seconds: int) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    """A prompt of 6 s submitted and handed over, running at the server; the adapter counts cancels."""
    admit, _, router, settings = parts(store, settings, per_second, watch=True)
    provider = Counting(HttpTransport(per_second.url, timeout=5), price_per_output=PRICE)
    fleet = Fleet(settings.servers(), lambda s: provider)
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    per_second.sim.delay = 6.0
    job_id = submit(admit, f"watched-{max_seconds}", max_seconds=max_seconds)
    assert executor.run(job_id)  # submitted and handed over
    entry = store.watch_entry(job_id)
    assert entry["max"] == max_seconds and entry["sub"] == int(store.job(job_id)["submitted_at"])
    wait_until(lambda: per_second.sim.running is not None)
    return router, settings, provider, fleet, executor, job_id, entry


def new_watcher(store, settings, fleet, now: list[float]) -> ServerWatch:  # type: ignore[no-untyped-def]
    return ServerWatch("sim", fleet, store, lambda job, why: None, settings,
                       lambda *point: record(store.scripts, *point), lambda: now[0])


def collected_for_good(store, executor, router, server, job_id: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Once the server charged the interrupted prompt, its collect fails the job for good (never retried),
    max_seconds_exceeded; the job's record."""
    wait_until(lambda: server.sim.charges)
    with pytest.raises(AttemptFailed) as failed:
        executor.collect(job_id)
    assert router.route(failed.value) == "dead_letter", failed.value
    job = store.job(job_id)
    assert (job["state"], job["error_reason"]) == ("failed", "max_seconds_exceeded"), job
    return job


def test_a_watcher_that_takes_over_counts_max_seconds_from_the_submission(store, settings, per_second) -> None:
    """The watcher that heard the prompt start is gone; its successor finds it running by /history 1.5 s
    after its submission (Redis's clock) and interrupts it 0.6 s later by its own clock: 2 s in all, where
    counting from its own first sight would let it run 3.5 s."""
    router, settings, provider, fleet, executor, job_id, entry = watched(store, settings, per_second, 2)
    shard = JobKeys(job_id).shard
    wait_until(lambda: store.server_ms(shard) - entry["sub"] >= 1_500)
    now = [1000.0]
    successor = new_watcher(store, settings, fleet, now)
    successor.tick()  # asks /history: running (no execution_start heard here)
    now[0] += max(0.6, settings.watch_poll_seconds)
    successor.tick()
    assert provider.cancels == [entry["op"]]
    job = collected_for_good(store, executor, router, per_second, job_id)
    [charge] = per_second.sim.charges
    assert job["settled"] == str(charge["units"]) and 2_000 <= charge["ms"] < 6_000


def test_a_new_hand_over_of_the_same_prompt_keeps_its_count(store, settings, per_second) -> None:
    """Heard starting, then collected while still running (handed back to the watcher under a new
    generation): the count goes on from the start heard, so the interrupt comes max_seconds after it."""
    router, settings, provider, fleet, executor, job_id, entry = watched(store, settings, per_second, 1)
    now = [1000.0]
    watch = new_watcher(store, settings, fleet, now)
    watch.on_message(orjson.dumps({"type": "execution_start", "data": {"prompt_id": entry["op"]}}).decode())
    assert executor.collect(job_id)  # still running: back to the watcher
    assert store.watch_entry(job_id)["gen"] > entry["gen"]
    wait_until(lambda: store.server_ms(JobKeys(job_id).shard) - entry["sub"] >= 1_000)
    now[0] += max(1.0, settings.watch_poll_seconds)
    watch.tick()
    assert provider.cancels == [entry["op"]]
    collected_for_good(store, executor, router, per_second, job_id)


@pytest.mark.parametrize("watch", [False, True])
def test_a_prompt_stopped_at_max_seconds_on_a_server_without_timestamps_is_not_a_cancel(
        store, settings, per_second, watch: bool) -> None:
    """An older server gives no seconds: the run is booked at the bound, and the job fails
    max_seconds_exceeded (reckon stopped it) whether the worker's own wait or the watcher interrupted it,
    where it was honoured as an operator's cancel."""
    admit, _, router, settings = parts(store, settings, per_second, watch=watch)
    fleet = Fleet(settings.servers(), lambda s: Untimed(HttpTransport(s.url, timeout=5), price_per_output=PRICE))
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    per_second.sim.delay = 4.0
    job_id = submit(admit, f"untimed-{watch}", max_seconds=1)
    if watch:
        assert executor.run(job_id)
        entry = store.watch_entry(job_id)
        wait_until(lambda: per_second.sim.running is not None)
        now = [1000.0]
        watcher = new_watcher(store, settings, fleet, now)
        watcher.on_message(orjson.dumps({"type": "execution_start", "data": {"prompt_id": entry["op"]}}).decode())
        wait_until(lambda: store.server_ms(JobKeys(job_id).shard) - entry["sub"] >= 1_000)
        now[0] += max(1.0, settings.watch_poll_seconds)
        watcher.tick()
        wait_until(lambda: per_second.sim.charges)
        with pytest.raises(AttemptFailed) as failed:
            executor.collect(job_id)
    else:
        with pytest.raises(AttemptFailed) as failed:
            executor.run(job_id)
    assert router.route(failed.value) == "dead_letter"
    job = store.job(job_id)
    assert (job["state"], job["error_reason"]) == ("failed", "max_seconds_exceeded")
    assert job["settled"] == "5"  # no output; the bound: 1 s at 5 a second
    assert store.attempts(job_id)[0]["seconds_ms"] == 1_000
    assert balanced(store)["settled"] == 5
