"""The sweeper at scale and bounded memory: the wake set, two sweepers at once, retention."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter

import orjson

from pipeline.blobs.local import BlobStore
from pipeline.operate import cli
from pipeline.state import keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper
from tests.pipeline.test_failures import attempt, balanced, inject

DAY = 24 * 3600


def sweeper(store, settings, *, ahead: float = 0.0) -> Sweeper:
    return Sweeper(store, Publisher(actors.broker), settings, clock=lambda: time.time() + ahead)


def commands(store) -> int:
    return int(store.redis.info("stats")["total_commands_processed"])


def job_keys(job_id: str) -> list[str]:
    j = JobKeys(job_id)
    return [j.record, j.attempts, j.events, j.outputs, j.workflow, j.progress, j.progress_seen]


def test_a_finished_job_drops_its_workflow_and_is_purged_after_retention(store, settings, admit,
                                                                         make_executor, sim) -> None:
    job_id = admit()
    assert store.workflow(job_id) is not None
    assert make_executor(sim).run(job_id) is True
    t = TenantKeys("acme")
    assert store.redis.exists(*job_keys(job_id)) == 1  # one key: its record, the rest packed in it
    assert store.redis.zscore(t.done, job_id) is not None
    retention = settings.retention_seconds
    assert sweeper(store, settings, ahead=retention - 60).sweep_once().get("purged", 0) == 0
    assert sweeper(store, settings, ahead=retention + 1).sweep_once()["purged"] == 1
    assert store.redis.exists(*job_keys(job_id)) == 0
    assert [store.redis.zscore(index, job_id) for index in (t.jobs, t.done, t.dead)] == [None, None, None]
    assert store.redis.zscore(keys.ShardKeys(0).wake, "acme") is None  # nothing left to do for this tenant
    assert balanced(store)["settled"] == 10  # the money stays on the ledger


def test_a_dead_letter_keeps_its_workflow_for_replay_until_retention(store, settings, admit, make_executor,
                                                                     make_router, sim) -> None:
    job_id = admit()
    inject(sim, {"kind": "policy"})
    assert attempt(make_executor(sim), make_router(), job_id) == "dead_letter"
    assert store.workflow(job_id) is not None
    store.replay(job_id)
    assert store.redis.zscore(TenantKeys("acme").done, job_id) is None  # live again: not purged
    assert make_executor(sim).run(job_id) is True
    assert store.workflow(job_id) is None


def test_an_idle_pass_costs_the_same_round_trips_whatever_the_number_of_tenants(store, settings) -> None:
    for n in range(200):
        create_tenant(store.redis, f"idle{n}", 100)
    before_ms = store.server_ms()
    before = commands(store)
    assert sweeper(store, settings).sweep_once() == {}
    # three round trips: the heartbeat (HSET), unpark (FCALL, ZCARD of the parked set) and take-due
    # (FCALL and its one range query), plus the INFO read here
    assert commands(store) - before == 6
    assert int(store.redis.hget(keys.SWEEPER, "at")) >= before_ms


def test_the_wake_entry_is_the_true_next_due_time(store, settings, admit, make_executor, make_router) -> None:
    job_id = admit()
    claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op", servers={"sim": 1000})
    store.retry(claim, delay_ms=45_000, error_class="transient")
    due = int(store.job(job_id)["retry_at"])
    sweeper(store, settings, ahead=settings.outbox_grace_seconds + 1).sweep_once()  # visits: the outbox was due
    assert store.redis.zscore(keys.ShardKeys(0).wake, "acme") == due
    assert sweeper(store, settings, ahead=30).sweep_once() == {}  # not due: the tenant is not even visited
    assert sweeper(store, settings, ahead=46).sweep_once()["retries_promoted"] == 1


def test_a_renewed_lease_is_taken_over_when_its_renewal_runs_out(store, settings, admit) -> None:
    job_id = admit()
    claim = store.claim(job_id, worker="w", lease_ms=10_000, operation_id="op", servers={"sim": 1000})
    store.heartbeat(claim, lease_ms=30_000)  # the record's expiry moves; the index keeps the claim's
    leases, expires = TenantKeys("acme").leases, int(store.job(job_id)["lease_expires"])
    assert store.redis.zscore(leases, job_id) < expires
    assert sweeper(store, settings, ahead=11).sweep_once().get("leases_expired", 0) == 0  # renewed: not taken
    assert store.redis.zscore(leases, job_id) == expires  # the entry moved to the renewed expiry
    assert store.redis.zscore(keys.ShardKeys(0).wake, "acme") <= expires
    assert sweeper(store, settings, ahead=25).sweep_once().get("leases_expired", 0) == 0
    assert store.job(job_id)["state"] == "running"
    assert sweeper(store, settings, ahead=31).sweep_once()["leases_expired"] == 1
    assert store.job(job_id)["state"] == "reconciling"


def test_two_sweepers_at_once_take_different_tenants(store, settings) -> None:
    for n in range(10):
        create_tenant(store.redis, f"t{n}", 100)
        store.redis.zadd(keys.ShardKeys(0).wake, {f"t{n}": 1})
    _, first = store.take_due(keys.ShardKeys(0), limit=6, hold_ms=30_000)
    _, second = store.take_due(keys.ShardKeys(0), limit=6, hold_ms=30_000)
    assert len(first) == 6 and len(second) == 4 and not set(first) & set(second)
    assert store.take_due(keys.ShardKeys(0), limit=6, hold_ms=30_000)[1] == []


def test_a_sweeper_that_dies_mid_pass_leaves_the_tenant_due_after_the_hold(store, settings, admit) -> None:
    admit()
    ahead = settings.outbox_grace_seconds + 1
    now = int((time.time() + ahead) * 1000)
    assert store.take_due(keys.ShardKeys(0), limit=10, hold_ms=30_000, now_ms=now) == (now, ["acme"])  # it dies here
    assert sweeper(store, settings, ahead=ahead).sweep_once() == {}
    assert sweeper(store, settings, ahead=ahead + 31).sweep_once()["redelivered"] == 1


def test_blob_gc_removes_only_what_no_job_on_record_holds(store, settings, admit, make_executor, sim, capsys,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("RECKON_BLOB_DIR", settings.blob_dir)
    job_id = admit()
    assert make_executor(sim).run(job_id) is True
    blobs = BlobStore(settings.blob_dir)
    held = blobs.path(store.outputs(job_id)[0]["sha256"])
    orphan, fresh = blobs.path(blobs.put(b"orphan")), blobs.path(blobs.put(b"just written"))
    hour_ago = time.time() - 3601
    for path in (held, orphan):
        os.utime(path, (hour_ago, hour_ago))
    assert cli.main(["blobs", "gc"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out) == {"removed": 1, "kept": 2, "referenced": 1}
    assert (held.exists(), orphan.exists(), fresh.exists()) == (True, False, True)
    sweeper(store, settings, ahead=settings.retention_seconds + 1).sweep_once()  # the job is purged
    assert cli.main(["blobs", "gc"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out) == {"removed": 1, "kept": 1, "referenced": 0}
    assert not held.exists()


def test_two_sweepers_on_one_tenant_publish_each_outbox_entry_once(store, settings) -> None:
    """A visit longer than the hold (0.3 s against a broker taking 30 ms a message for 15 jobs a
    tenant): both sweepers visit the same tenants, and the outbox entry's take decides who sends."""
    settings = dataclasses.replace(settings, outbox_grace_seconds=120.0, sweep_hold_seconds=0.3)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    jobs = []
    for tenant in ("t0", "t1", "t2"):
        create_tenant(store.redis, tenant, 1_000)
        for n in range(15):
            job_id = admitter.submit(tenant, f"k{n}", {"kind": "image", "workflow": {"3": {}}, "outputs": 1}).job_id
            claim = store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"op-{job_id}",
                                servers={"sim": 1000})
            store.retry(claim, delay_ms=0, error_class="transient")  # due now; its outbox entry too
            jobs.append(job_id)
    published: Counter[str] = Counter()
    lock = threading.Lock()

    def publish(job_id: str, route: str) -> None:
        time.sleep(0.03)
        with lock:
            published[job_id] += 1

    def sweep(one: Sweeper) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
                store.redis.zcard(TenantKeys(t).outbox) == 0 and store.redis.zcard(TenantKeys(t).retry) == 0
                for t in ("t0", "t1", "t2")):
            one.sweep_once()

    threads = [threading.Thread(target=sweep, args=(Sweeper(store, publish, settings),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {store.job(job_id)["state"] for job_id in jobs} == {"queued"}
    assert published == Counter(dict.fromkeys(jobs, 1))  # 45 jobs, 45 messages
