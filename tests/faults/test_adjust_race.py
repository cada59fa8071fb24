"""Adjustments of one job from real processes at once (issue 32 review): two Python processes book the
same ids through pipeline/state/bookings.py, a third runs the job's own life (claim, submit, charge,
finish, packed) meanwhile, and two ``reckon cost adjust`` processes book one id together; at one shard
and at RECKON_SHARDS=2 (the tenant in shard 1).

Each id books once: of two processes asking the same amount, one books it and the other gets the same
answer (replayed, same units and time); asking another amount, the second is refused. The ledger
balances, the tenant's settled is the charge plus every adjustment, the job's record lists each
adjustment once (a pack between two adjustments loses none), and the usage records add up to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import orjson
import pytest

from pipeline.state import booked, keys, records
from pipeline.state.keys import TenantKeys
from pipeline.state.status import audit
from pipeline.state.store import Store
from tests.conftest import wait_until
from tests.faults.conftest import BIN, ROOT
from tests.pipeline.test_adjustments import admit

IDS = 200  # ids each adjuster books; every 7th is asked with another amount by the second one

ADJUSTER = """
import os, sys, orjson
from pipeline.errors import BookingRefused
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
redis = connect_url(os.environ["RECKON_REDIS_URL"])
store = Store(redis, shards=int(os.environ["RECKON_SHARDS"]))
job, name, ids, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
redis.incr("race:ready")
redis.blpop(["race:go:" + name], timeout=60)
out = []
for i in range(ids):
    units = 1 + i % 5 + (extra if i % 7 == 0 else 0)
    try:
        done = store.adjust(job, units, f"race-{i}", "race")
        out.append([i, units, done.units, done.at, done.replayed])
    except BookingRefused:
        out.append([i, units, None, None, None])
print(orjson.dumps(out).decode())
"""

LIFE = """
import os, random, sys, time
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
redis = connect_url(os.environ["RECKON_REDIS_URL"])
store = Store(redis, shards=int(os.environ["RECKON_SHARDS"]))
job = sys.argv[1]
redis.incr("race:ready")
redis.blpop(["race:go:life"], timeout=60)
pause = lambda: time.sleep(random.random() / 30)  # spreads the steps over the adjusters' run
claim = store.claim(job, worker="w", lease_ms=60_000, operation_id="op-race", servers={"gpu-a": 1000})
pause()
store.mark_submit(claim, epoch="e", lease_ms=60_000)
pause()
store.charge(claim, 10)
pause()
store.store_output(claim, 0, {"sha256": "a"})
pause()
store.finish(claim, "completed")
print("done")
"""


@pytest.fixture(params=[1, 2], ids=["one-shard", "two-shards"])
def deployment(request: pytest.FixtureRequest, redis_client, redis_server: str) -> Iterator[tuple[Store, str, dict]]:
    """A store at the shard count, a tenant in the last shard, and the children's environment."""
    count = request.param
    keys.use_shards(count)
    try:
        tenant = next(t for t in (f"t{i}" for i in range(100)) if keys.shard_of(t) == count - 1)
        store = Store(redis_client, shards=count)
        env = os.environ | {"RECKON_REDIS_URL": redis_server, "RECKON_SHARDS": str(count)}
        yield store, tenant, env
    finally:
        keys.use_shards(1)


def redis_now(store: Store) -> int:
    seconds, micros = store.redis.time()
    return seconds * 1000 + micros // 1000


def start(env: dict, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """Kill (by pid) each process still running, and reap it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def finish(proc: subprocess.Popen[bytes]) -> bytes:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out


def test_two_processes_book_each_id_once_while_the_job_runs_settles_and_is_packed(deployment, tenant) -> None:
    store, name, env = deployment
    tenant(name, 10_000)
    job = f"{name}." + "a" * 20
    admit(store, job, 30, now_ms=redis_now(store))  # the children run on Redis's clock
    procs = {"a": start(env, "-c", ADJUSTER, job, "a", str(IDS), "0"),
             "b": start(env, "-c", ADJUSTER, job, "b", str(IDS), "1"),
             "life": start(env, "-c", LIFE, job)}
    wait_until(lambda: store.redis.get("race:ready") == "3" or any(p.poll() is not None for p in procs.values()),
               timeout=60)
    with store.redis.pipeline(transaction=False) as pipe:  # all three go together, once all three wait
        for who in procs:
            pipe.rpush(f"race:go:{who}", 1)
        pipe.execute()
    try:
        a, b = (orjson.loads(finish(procs[who])) for who in ("a", "b"))
        assert finish(procs["life"]) == b"done\n"
    finally:
        stop(*procs.values())

    expected = 0
    for (i, units_a, got_a, at_a, replayed_a), (_, units_b, got_b, at_b, replayed_b) in zip(a, b, strict=True):
        if units_a == units_b:  # same amount: one books, the other gets the same answer
            assert (got_a, at_a) == (got_b, at_b) == (units_a, at_a)
            assert sorted([replayed_a, replayed_b]) == [False, True], i
            expected += units_a
        else:  # another amount under the id: exactly one books, the other is refused
            assert [got_a, got_b].count(None) == 1, i
            assert [replayed_a, replayed_b].count(False) == 1, i
            expected += got_a if got_a is not None else got_b
    ledger = store.ledger(name)
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    assert (ledger["reserved"], ledger["uncertain"], ledger["settled"]) == (0, 0, 10 + expected)
    assert audit(store.redis, [name]) == []
    record = store.job(job)
    assert (record["state"], record["settled"], record["adjusted"]) == ("completed", "10", str(expected))
    listed = booked.adjustments(record)
    assert sorted(x["id"] for x in listed) == sorted(f"race-{i}" for i in range(IDS))
    assert sum(x["units"] for x in listed) == expected
    assert store.redis.hlen(TenantKeys(name).bookings) == IDS
    rows = list(records.every(store.redis, name, start_ms=0, end_ms=2**52))
    assert sorted(r["kind"] for r in rows).count("adjustment") == IDS
    assert [r["booking_id"] for r in rows if r["kind"] != "adjustment"] == [f"charge:{job}:1"]
    assert sum(r["units"] for r in rows) == ledger["settled"]


def test_two_cost_adjust_commands_book_one_id_once(deployment, tenant) -> None:
    store, name, env = deployment
    tenant(name, 10_000)
    job = f"{name}." + "b" * 20
    admit(store, job, 30, now_ms=redis_now(store))  # the children run on Redis's clock
    for n in range(3):
        argv = ["cost", "adjust", job, "--units", "4", "--id", f"cli-{n}", "--reason", "late"]
        procs = [start(env, str(BIN / "reckon"), *argv) for _ in range(2)]
        try:
            answers = [orjson.loads(finish(p)) for p in procs]
        finally:
            stop(*procs)
        assert sorted(x.pop("replayed") for x in answers) == [False, True]
        assert answers[0] == answers[1]
    ledger = store.ledger(name)
    assert (ledger["settled"], ledger["available"]) == (12, 10_000 - 30 - 12)
    assert store.redis.hlen(TenantKeys(name).bookings) == 3
