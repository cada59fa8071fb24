"""pipeline/work/watcher.py's progress writes: at most one per job per interval, the highest value
winning, a point pending at a prompt's end dropped. A ServerWatch is fed websocket frames as its
loop would (each followed by a tick), on an injected clock, against the real Redis."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from pipeline.claims import Claim
from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.settings import Settings
from pipeline.state.keys import JobKeys
from pipeline.state.progress import Coalescer, events_after, record
from pipeline.state.store import Store
from pipeline.work.watcher import ServerWatch

from .conftest import single


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rendering:
    """A server whose every prompt is still running: a tick's /history check collects nothing."""

    name, price_per_output, client_id = "comfyui", 10, "reckon"

    def status(self, operation_id: str) -> OperationStatus:
        return OperationStatus("running")

    def epoch(self) -> str:
        return "e1"

    def offers(self) -> None:  # does not say what it can run: taken to run anything
        return None

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int], *,
               front: bool = False) -> dict[str, str] | None:
        raise AssertionError("a watcher submits nothing")

    def cancel(self, operation_id: str) -> None:
        raise AssertionError("a watcher cancels nothing")

    def fetch(self, ref: OutputRef) -> bytes:
        raise AssertionError("a watcher fetches nothing")


@dataclasses.dataclass
class Watched:
    watch: ServerWatch
    job_id: str
    claim: Claim
    clock: Clock
    published: list[tuple[str, str]]

    def receive(self, kind: str, **data: Any) -> None:
        """One websocket frame of the job's prompt, then the tick the watcher's loop runs after it."""
        frame = {"type": kind, "data": {"prompt_id": self.claim.operation_id, **data}}
        self.watch.on_message(orjson.dumps(frame).decode())  # a text frame (bytes are previews)
        self.watch.tick()

    def progress(self, value: int, node: str = "3", max_value: int = 20) -> None:
        self.receive("progress", value=value, max=max_value, node=node)

    def written(self, store: Store) -> list[tuple[str, int]]:
        return [(e["node"], e["value"]) for e in events_after(store.redis, self.job_id) if e["type"] == "progress"]


@pytest.fixture
def watched(store: Store, settings: Settings, admit: Callable[..., str]) -> Callable[..., Watched]:
    """Factory: a job claimed, submitted and handed to the watcher of server ``sim``, and that
    server's ServerWatch on a test clock (interval 1 s unless told)."""

    def make(interval: float = 1.0, ckpt: str = "") -> Watched:
        job_id = admit()
        if ckpt:  # the digest admission writes for a workflow that names a checkpoint
            store.redis.hset(JobKeys(job_id).record, "ckpt", ckpt)
        held = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-1", servers={"sim": 4})
        assert held is not None
        store.mark_submit(held, epoch="e1", lease_ms=30_000)
        held = store.await_provider(held, lease_ms=30_000)
        clock, published = Clock(), []
        watch = ServerWatch("sim", single(Rendering()), store, lambda job, why: published.append((job, why)),
                            dataclasses.replace(settings, progress_interval_seconds=interval),
                            lambda *point: record(store.scripts, *point), clock)
        return Watched(watch, job_id, held, clock, published)

    return make


def test_many_points_within_an_interval_make_one_write_then_the_highest_one(store, watched) -> None:
    w = watched()
    for value in range(1, 21):  # 20 messages in 0.6 s (steps of 1/32 s: exact in binary)
        w.clock.now = 1000.0 + (value - 1) / 32
        w.progress(value)
    w.clock.now = 1000.75
    w.progress(12)  # a replay: below what the node reached
    assert w.written(store) == [("3", 1)]  # the first went out at once; the rest waits
    w.clock.now = 1000.0 + 0.999
    w.watch.tick()
    assert w.written(store) == [("3", 1)]
    w.clock.now = 1001.0  # a second after the first write: the tick writes the pending point
    w.watch.tick()
    assert w.written(store) == [("3", 1), ("3", 20)]
    w.clock.now += 5
    w.watch.tick()  # nothing pending: nothing written
    assert w.written(store) == [("3", 1), ("3", 20)]
    events = events_after(store.redis, w.job_id)
    assert [(e["seq"], e["type"]) for e in events] == [(1, "state"), (2, "state"), (3, "progress"), (4, "progress")]
    assert events[-1] | {"at": None} == {"seq": 4, "at": None, "type": "progress", "attempt": 1, "node": "3",
                                         "value": 20, "max": 20}


def test_a_point_pending_when_the_prompt_ends_is_dropped(store, watched) -> None:
    w = watched()
    for value in (1, 2, 3):
        w.progress(value)
        w.clock.now += 0.1
    w.receive("executing", node=None)  # the prompt ended: a collect goes out
    assert w.published == [(w.job_id, "collect")]
    w.clock.now += 10
    w.watch.tick()
    assert w.written(store) == [("3", 1)]  # 2 and 3 never written: the completion says more
    assert store.redis.hget(JobKeys(w.job_id).record, "event_seq") == "3"  # queued, running, one point


def test_after_the_interval_the_next_point_goes_out_at_once(store, watched) -> None:
    w = watched()
    w.progress(1)  # t = 0: written
    w.clock.now = 1000.5
    w.progress(2)  # pending
    w.clock.now = 1001.0
    w.progress(3, node="7")  # a second on: this newer point (of the next node) replaces 2 and is written
    w.clock.now = 1001.25
    w.progress(4, node="7")  # pending again, for a second after t = 1.0
    assert w.written(store) == [("3", 1), ("7", 3)]
    w.clock.now = 1002.0
    w.progress(5, node="7")  # 5 replaces 4 and goes out with this message
    assert w.written(store) == [("3", 1), ("7", 3), ("7", 5)]


def test_an_interval_of_zero_writes_every_new_point(store, watched) -> None:
    w = watched(interval=0)
    for value in (1, 2, 2, 3):  # the replayed 2 is not new
        w.progress(value)
    assert w.written(store) == [("3", 1), ("3", 2), ("3", 3)]


def test_a_point_of_a_new_attempt_replaces_the_pending_one(store, admit) -> None:
    job_id = admit()
    first = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-1", servers={"sim": 4})
    assert first is not None
    clock = Clock()
    coalescer = Coalescer(lambda *point: record(store.scripts, *point), 1.0, clock)
    coalescer.offer(job_id, 1, "op-1", "3", 1, 20)  # written
    coalescer.offer(job_id, 1, "op-1", "3", 9, 20)  # pending
    store.retry(first, delay_ms=0, error_class="transient")
    assert store.promote(job_id) == "queued"
    second = store.claim(job_id, worker="w1", lease_ms=30_000, operation_id="op-2", servers={"sim": 4})
    assert second is not None and second.attempt == 2
    clock.now += 0.5
    coalescer.offer(job_id, 2, "op-2", "3", 2, 20)  # below 9, but the new attempt's: it replaces 9
    assert [(e["attempt"], e["value"]) for e in events_after(store.redis, job_id) if e["type"] == "progress"] == [
        (1, 1)]  # the interval still counts from the job's last write
    clock.now += 0.5
    coalescer.flush()
    assert [(e["attempt"], e["value"]) for e in events_after(store.redis, job_id) if e["type"] == "progress"] == [
        (1, 1), (2, 2)]


def test_the_interval_is_a_setting_of_zero_or_more() -> None:
    assert Settings().progress_interval_seconds == 1.0
    assert Settings.from_env({"RECKON_PROGRESS_INTERVAL_SECONDS": "0.25"}).progress_interval_seconds == 0.25
    for bad in ("-1", "nan"):
        with pytest.raises(ValueError, match="RECKON_PROGRESS_INTERVAL_SECONDS"):
            Settings.from_env({"RECKON_PROGRESS_INTERVAL_SECONDS": bad})


def test_a_cancel_reaches_the_watcher_on_the_watch_list_without_a_read_of_the_jobs_record(store, watched) -> None:
    """A tick reads the watch list once (HGETALL) and no job record: a cancel is marked on the entry."""
    w = watched()
    w.watch.tick()
    assert w.published == []
    store.redis.config_resetstat()
    w.clock.now += 2  # the next tick is due
    w.watch.tick()
    stats = store.redis.info("commandstats")
    assert "cmdstat_hget" not in stats  # no record read per watched job
    assert store.cancel(w.job_id)[0] == "running"
    assert store.watch_entry(w.job_id)["cancel"] == 1
    w.clock.now += 2
    w.watch.tick()
    assert w.published == [(w.job_id, "collect")]  # a worker takes the prompt off its server
    w.clock.now += 2
    w.watch.tick()
    assert w.published == [(w.job_id, "collect")]  # once per hand-over


def test_the_watcher_hands_a_prompts_checkpoint_to_its_run_clock(store, watched) -> None:
    """The job's ``ckpt`` comes on its watch entry (lua/await.lua): the run clock learns it at the start."""
    w = watched(ckpt="0123456789abcdef")
    w.receive("execution_start")
    assert w.watch.runs.begun[w.job_id][1:] == ("0123456789abcdef", None)  # the first heard: no predecessor
    w.clock.now += 2
    w.receive("executing", node=None)
    assert (w.watch.runs.last, list(w.watch.runs.runs)) == ("0123456789abcdef", [2000])
