"""Queue history and recent problems for the status page, against the real redis-server."""

from __future__ import annotations

import dataclasses
import threading

import orjson

from pipeline.state import history, keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until

STEP_MS = history.RESOLUTION_S * 1000
#: A slot start far from zero, so slot numbers wrap at an arbitrary place.
T0 = 1_700_000_010_000 // STEP_MS * STEP_MS


def figures(depth: int, oldest: float = 0.0, batch_depth: int = 0) -> dict:
    return {"interactive": {"depth": depth, "oldest_age_s": oldest, "running": 9},
            "batch": {"depth": batch_depth, "oldest_age_s": 0.0}}


def test_the_hash_never_holds_more_than_an_hour_of_slots(redis_client) -> None:
    for n in range(history.SLOTS + 10):  # ten slots past the hour: the first ten are overwritten
        history.put(redis_client, figures(n), T0 + n * STEP_MS + 1234)
    assert redis_client.hlen(keys.HISTORY) == 120
    now = T0 + (history.SLOTS + 9) * STEP_MS + 5_000
    samples = history.read(redis_client, now)
    assert [s["interactive"]["depth"] for s in samples] == list(range(10, 130))  # oldest first, after wrap-around
    assert [s["at"] for s in samples] == [T0 + n * STEP_MS for n in range(10, 130)]  # each at its slot's start
    assert samples[0] == {"at": T0 + 10 * STEP_MS, "interactive": {"depth": 10, "oldest_age_s": 0.0},
                          "batch": {"depth": 0, "oldest_age_s": 0.0}}  # only depth and oldest age are kept


def test_samples_older_than_an_hour_are_not_read(redis_client) -> None:
    history.put(redis_client, figures(1), T0)
    history.put(redis_client, figures(2), T0 + 10 * STEP_MS)
    history.put(redis_client, figures(3), T0 + 11 * STEP_MS)
    assert len(history.read(redis_client, T0 + 11 * STEP_MS)) == 3
    later = T0 + history.WINDOW_S * 1000 + 10 * STEP_MS  # exactly one hour after the second sample
    assert [s["interactive"]["depth"] for s in history.read(redis_client, later)] == [3]
    assert redis_client.hlen(keys.HISTORY) == 3  # readers drop, only writers replace


def test_one_sample_per_slot_and_a_stale_slot_is_written_again(redis_client) -> None:
    taken = []

    def snapshot() -> dict:
        taken.append(1)
        return {"classes": figures(len(taken), oldest=2.5, batch_depth=7)}

    assert history.record(redis_client, T0 + 100, snapshot) is True
    assert history.record(redis_client, T0 + STEP_MS - 1, snapshot) is False  # same slot: one HGET, no snapshot
    assert len(taken) == 1
    stored = orjson.loads(redis_client.hget(keys.HISTORY, history.field(T0)))
    assert stored == {"at": T0, "interactive": {"depth": 1, "oldest_age_s": 2.5},
                      "batch": {"depth": 7, "oldest_age_s": 0.0}}
    an_hour_later = T0 + history.WINDOW_S * 1000  # same field, but its sample is an hour old
    assert history.field(an_hour_later) == history.field(T0)
    assert history.record(redis_client, an_hour_later, snapshot) is True
    assert orjson.loads(redis_client.hget(keys.HISTORY, history.field(T0)))["at"] == an_hour_later
    assert redis_client.hlen(keys.HISTORY) == 1


def dead(client, tenant: str, job_id: str, at: int, cls: str = "batch") -> None:
    client.sadd(keys.ShardKeys(0).tenants, tenant)
    client.zadd(TenantKeys(tenant).dead, {job_id: at})
    client.hset(JobKeys(job_id).record, mapping={
        "priority": cls, "error_class": "provider_rejected", "error_reason": "policy", "updated_at": at,
        "error_detail": '{"message": "secret provider text"}'})


def test_recent_takes_the_newest_over_every_tenant(redis_client) -> None:
    for n in range(30):  # acme fails at even times, globex at odd ones
        tenant = "acme" if n % 2 == 0 else "globex"
        dead(redis_client, tenant, f"{tenant}.{n:020x}", 1000 + n)
    dead(redis_client, "initech", f"initech.{99:020x}", 5, cls="interactive")  # the oldest of all
    rows = history.recent(redis_client, ["acme", "globex", "initech"], "dead", limit=20)
    assert [row["at"] for row in rows] == [1000 + n for n in range(29, 9, -1)]
    assert rows[0] == {"id": f"globex.{29:020x}", "class": "batch", "error_class": "provider_rejected",
                       "reason": "policy", "at": 1029}
    assert "secret" not in orjson.dumps(rows).decode()
    assert [row["id"] for row in history.recent(redis_client, ["initech"], "dead")] == [f"initech.{99:020x}"]
    assert history.recent(redis_client, ["acme", "globex"], "review") == []


def test_the_sweeper_records_one_sample_per_slot(store, settings, admit) -> None:
    for n in range(3):
        admit(f"k{n}", priority="batch" if n == 2 else "interactive")
    mid_slot = history.slot_start(store.server_ms()) + STEP_MS // 2
    readings: list[int] = []

    def clock() -> float:  # every pass reads the same time: all its passes fall in one slot
        readings.append(1)
        return mid_slot / 1000

    sweeper = Sweeper(store, Publisher(actors.broker), dataclasses.replace(settings, sweep_interval_seconds=0.01),
                      clock=clock)
    stop = threading.Event()
    thread = threading.Thread(target=sweeper.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: len(readings) >= 10)  # a few passes
    finally:
        stop.set()
        thread.join(timeout=10)
    (sample,) = history.read(store.redis, mid_slot)
    assert (sample["at"], sample["interactive"]["depth"], sample["batch"]["depth"]) == (mid_slot - STEP_MS // 2, 2, 1)
    assert 0 < sample["interactive"]["oldest_age_s"] < 60 and 0 < sample["batch"]["oldest_age_s"] < 60
    assert store.redis.hlen(keys.HISTORY) == 1
