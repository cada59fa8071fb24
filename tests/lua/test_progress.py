"""lua/progress.lua through pipeline.state.progress: once per (attempt, node, value), only for the running attempt."""

from __future__ import annotations

import orjson
import pytest

from pipeline.claims import Claim
from pipeline.state import progress
from pipeline.state.keys import JobKeys
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant

from .test_scripts import NOW, admit

JOB = "acme.00000000000000000001"


@pytest.fixture
def acme(store: Store) -> Store:
    create_tenant(store.redis, "acme", 100)
    return store


def claim(store: Store, op: str, now: int = NOW) -> Claim:
    held = store.claim(JOB, worker="w1", now_ms=now, lease_ms=10_000, operation_id=op, servers={"s1": 4})
    assert held is not None
    return held


def send(store: Store, held: Claim, node: str, value: float, *, attempt: int | None = None, op: str | None = None,
         keep: int = progress.DEFAULT_KEEP, now: int = NOW) -> bool:
    return progress.record(store.scripts, JOB, held.attempt if attempt is None else attempt,
                           held.operation_id if op is None else op, node, value, 20, keep=keep, now_ms=now)


def points(store: Store) -> list[dict]:
    return [orjson.loads(raw) for raw in store.redis.lrange(JobKeys(JOB).progress, 0, -1)]


def marks(store: Store) -> dict[str, str]:
    """The job's progress marks: record fields ``pm:<attempt>:<node>`` -> highest value recorded."""
    return {field: value for field, value in store.redis.hgetall(JobKeys(JOB).record).items()
            if field.startswith("pm:")}


def test_a_replayed_stream_of_messages_is_recorded_once(acme: Store) -> None:
    admit(acme)
    held = claim(acme, "op-1")
    messages = [("3", 1), ("3", 2), ("7", 1), ("3", 3)]
    assert [send(acme, held, node, value, now=NOW + value) for node, value in messages] == [True] * 4
    assert [send(acme, held, node, value) for node, value in messages] == [False] * 4  # websocket reconnected
    assert send(acme, held, "3", 2.5) is False  # below what node 3 reached
    assert points(acme) == [
        {"seq": 3, "at": NOW + 1, "type": "progress", "attempt": 1, "node": "3", "value": 1, "max": 20},
        {"seq": 4, "at": NOW + 2, "type": "progress", "attempt": 1, "node": "3", "value": 2, "max": 20},
        {"seq": 5, "at": NOW + 1, "type": "progress", "attempt": 1, "node": "7", "value": 1, "max": 20},
        {"seq": 6, "at": NOW + 3, "type": "progress", "attempt": 1, "node": "3", "value": 3, "max": 20},
    ]
    assert acme.redis.hget(JobKeys(JOB).record, "event_seq") == "6"


def test_a_late_message_of_an_earlier_attempt_is_dropped(acme: Store) -> None:
    admit(acme)
    first = claim(acme, "op-1")
    assert send(acme, first, "3", 5) is True
    acme.retry(first, delay_ms=0, error_class="transient", now_ms=NOW + 10)
    assert acme.promote(JOB, now_ms=NOW + 20) == "queued"
    second = claim(acme, "op-2", now=NOW + 30)
    assert second.attempt == 2
    assert send(acme, second, "3", 6, attempt=1, op="op-1") is False  # the old attempt's websocket, late
    assert send(acme, second, "3", 6, attempt=2, op="op-1") is False  # right number, another prompt
    assert send(acme, second, "3", 6, attempt=1, op="op-2") is False
    assert send(acme, second, "3", 1) is True  # a new attempt starts its nodes again
    assert [(p["attempt"], p["value"]) for p in points(acme)] == [(1, 5), (2, 1)]
    assert marks(acme) == {"pm:1:3": "5", "pm:2:3": "1"}  # each attempt's marks are its own


def test_only_a_running_job_records_progress(acme: Store) -> None:
    admit(acme)
    queued = Claim(JOB, 0, 1, "op-1")
    assert send(acme, queued, "3", 1) is False
    assert progress.record(acme.scripts, "acme.00000000000000000009", 1, "op-1", "3", 1, 20) is False  # no job
    held = claim(acme, "op-1")
    acme.finish(held, "failed", error_class="invalid_input", now_ms=NOW + 5)
    assert send(acme, held, "3", 1) is False
    assert acme.redis.exists(JobKeys(JOB).progress) == 0 and marks(acme) == {}
    assert acme.redis.hget(JobKeys(JOB).record, "event_seq") == "3"  # queued, running, failed


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "5"])
def test_a_value_that_is_not_a_finite_number_is_dropped(acme: Store, value) -> None:
    admit(acme)
    held = claim(acme, "op-1")
    assert send(acme, held, "3", value) is False
    assert acme.redis.exists(JobKeys(JOB).progress) == 0


def test_progress_keeps_the_last_n_points_and_state_events_keep_every_change(acme: Store) -> None:
    admit(acme)
    held = claim(acme, "op-1")
    assert all(send(acme, held, "3", value, keep=3) for value in range(1, 6))  # seqs 3..7
    acme.finish(held, "failed", error_class="invalid_input", now_ms=NOW + 5)  # seq 8
    assert [p["value"] for p in points(acme)] == [3, 4, 5]
    events = progress.events_after(acme.redis, JOB)
    assert [(e["seq"], e["type"]) for e in events] == [
        (1, "state"), (2, "state"), (5, "progress"), (6, "progress"), (7, "progress"), (8, "state")]
    assert [e.get("to") for e in events] == ["queued", "running", None, None, None, "failed"]
    assert [e["seq"] for e in progress.events_after(acme.redis, JOB, 6)] == [7, 8]
    assert progress.events_after(acme.redis, JOB, 8) == []
    assert progress.snapshot(acme.redis, JOB, 7) == ("failed", [events[-1]])
    assert progress.snapshot(acme.redis, "acme.00000000000000000009", 0) == (None, [])


def test_a_point_costs_five_commands_inside_the_script_and_a_dropped_one_one(acme: Store) -> None:
    """The script's cost, pinned (INFO commandstats counts the commands a function runs): one HMGET
    of the record (its fields and the node's mark), RPUSH, one HSET of the record (the mark and the
    event counter), XADD to the shard's stream of changes, and TIME when no clock is given; LTRIM only
    once the list is full."""
    admit(acme)
    held = claim(acme, "op-1")

    def cost(record) -> dict[str, int]:
        acme.redis.config_resetstat()
        record()
        stats = acme.redis.info("commandstats")
        return {name[len("cmdstat_"):]: v["calls"] for name, v in stats.items()
                if not name.startswith("cmdstat_config")}

    written = {"fcall": 1, "hmget": 1, "hset": 1, "rpush": 1, "xadd": 1}
    assert cost(lambda: send(acme, held, "3", 1, keep=2)) == written
    assert cost(lambda: send(acme, held, "3", 2, keep=2)) == written
    assert cost(lambda: send(acme, held, "3", 3, keep=2)) == written | {"ltrim": 1}  # a third point, two kept
    assert cost(lambda: progress.record(acme.scripts, JOB, held.attempt, held.operation_id, "3", 4, 20)) == (
        written | {"time": 1})  # Redis's clock, as the watcher calls it (50 kept: no trim)
    assert cost(lambda: send(acme, held, "3", 4)) == {"fcall": 1, "hmget": 1}  # not new for its node
    assert cost(lambda: send(acme, held, "3", 9, op="op-0")) == {"fcall": 1, "hmget": 1}  # not the running prompt
    assert [p["value"] for p in points(acme)] == [2, 3, 4]
    assert marks(acme) == {"pm:1:3": "4"}


def test_a_new_attempt_starts_its_own_marks_and_a_packed_job_keeps_none(acme: Store) -> None:
    admit(acme)
    first = claim(acme, "op-1")
    assert send(acme, first, "3", 5) and send(acme, first, "7", 2)
    acme.retry(first, delay_ms=0, error_class="transient", now_ms=NOW + 10)
    assert acme.promote(JOB, now_ms=NOW + 20) == "queued"
    second = claim(acme, "op-2", now=NOW + 30)
    assert send(acme, second, "7", 1) is True  # below the first attempt's mark: a mark of its own
    assert marks(acme) == {"pm:1:3": "5", "pm:1:7": "2", "pm:2:7": "1"}
    acme.store_output(second, 0, {"sha256": "a" * 64, "bytes": 1, "content_type": "image/png"}, now_ms=NOW + 40)
    acme.finish(second, "completed", now_ms=NOW + 50)
    assert marks(acme) == {} and acme.redis.exists(JobKeys(JOB).progress) == 0
