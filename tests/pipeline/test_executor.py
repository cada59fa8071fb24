"""Workers against the simulated ComfyUI over real HTTP and a real redis-server."""

from __future__ import annotations

import hashlib
import threading
import time

import dramatiq
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import IdempotencyConflict, StaleLease
from pipeline.providers import sim as simulated
from pipeline.state import keys
from pipeline.state.keys import ProviderKeys
from pipeline.state.submit import Admitter
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until


def charges(server: simulated.SimServer) -> list[dict]:
    with server.sim.cond:
        return list(server.sim.charges)


def test_a_job_runs_to_completion_and_settles_once(store, settings, admit, make_executor, sim) -> None:
    job_id = admit(outputs=3)
    assert make_executor(sim).run(job_id, worker="w1") is True
    job = store.job(job_id)
    assert (job["state"], job["attempt_count"], job["lease_gen"]) == ("completed", "1", "2")
    outputs = store.outputs(job_id)
    blobs = BlobStore(settings.blob_dir)
    assert sorted(outputs) == [0, 1, 2]
    assert len({o["sha256"] for o in outputs.values()}) == 3  # different bytes per output
    for output in outputs.values():
        data = blobs.read(output["sha256"])
        assert hashlib.sha256(data).hexdigest() == output["sha256"] and data.startswith(b"\x89PNG")
        assert output["bytes"] == len(data)
    assert [c["units"] for c in charges(sim)] == [30]
    assert store.ledger("acme") == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 30,
                                    "available": 9_970}
    attempt = store.attempts(job_id)[0]
    assert (attempt["state"], attempt["worker"], attempt["provider"]) == ("completed", "w1", "comfyui")
    assert [c["prompt_id"] for c in charges(sim)] == [attempt["operation_id"]]


def test_a_finished_job_is_not_run_again(store, admit, make_executor, sim) -> None:
    job_id = admit()
    executor = make_executor(sim)
    assert executor.run(job_id) is True
    assert executor.run(job_id) is False
    assert len(charges(sim)) == 1 and len(store.attempts(job_id)) == 1


def test_five_deliveries_of_one_message_run_the_job_once(store, admit, make_executor, sim, broker) -> None:
    job_id = admit(outputs=2)  # publishes once
    publish = Publisher(broker)
    for _ in range(4):
        publish(job_id, "interactive")
    actors.use(make_executor(sim))
    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    worker.start()
    try:
        broker.join("reckon-interactive", timeout=20_000)
        wait_until(lambda: store.job(job_id)["state"] == "completed")
    finally:
        worker.stop()
        actors.use(None)
    assert len(store.attempts(job_id)) == 1
    assert [c["outputs"] for c in charges(sim)] == [2]
    assert len(store.outputs(job_id)) == 2
    assert store.ledger("acme")["settled"] == 20 and store.ledger("acme")["reserved"] == 0
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "completed"]


def test_a_stale_worker_cannot_overwrite_the_reconciler(store, settings, admit, make_executor) -> None:
    slow = simulated.start(delay=1.0)
    try:
        job_id = admit()
        stale, fresh = make_executor(slow), make_executor(slow, reconcile_interval_seconds=0.05)
        failure: list[BaseException] = []

        def run_stale() -> None:
            try:
                stale.run(job_id, worker="stale")
            except StaleLease as exc:
                failure.append(exc)

        thread = threading.Thread(target=run_stale)
        thread.start()
        wait_until(lambda: slow.sim.queue()["queue_running"] or slow.sim.queue()["queue_pending"])
        # The stale worker stops reporting: its lease runs out and the sweeper starts reconciliation.
        sweeper = Sweeper(store, Publisher(actors.broker), settings, clock=lambda: time.time() + 60)
        assert sweeper.sweep_once()["leases_expired"] == 1
        assert store.job(job_id)["state"] == "reconciling"
        wait_until(lambda: fresh.reconcile(job_id, worker="fresh") and store.job(job_id)["state"] != "reconciling",
                   timeout=20)
        thread.join(timeout=20)
    finally:
        slow.close()
    assert len(failure) == 1
    job = store.job(job_id)
    assert job["state"] == "completed" and "lease_owner" not in job  # a finished job keeps no lease fields
    assert int(job["lease_gen"]) >= 2
    attempts = store.attempts(job_id)
    assert [(a["worker"], a["state"]) for a in attempts] == [("stale", "completed")]  # closed by the reconciler
    assert len(slow.sim.charges) == 1  # reconciliation asked; nothing was submitted again
    assert int(store.redis.hget(keys.ShardKeys(0).stats, "stale_writes_rejected")) >= 1
    assert store.ledger("acme") == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 10,
                                    "available": 9_990}


def test_an_unreachable_server_is_marked_and_the_attempt_given_back(store, admit, make_executor) -> None:
    closed = simulated.start()
    closed.close()  # nothing listens on this port any more
    job_id = admit()
    assert make_executor(closed).run(job_id) is True  # no AttemptFailed: the job is not at fault
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["attempts_allowed"]) == ("retry_wait", "connect_failed", "4")
    assert int(job["retry_at"]) <= store.server_ms()  # due at once: another server may take it
    assert store.provider_block("sim") == "provider_unreachable"
    assert store.redis.hget(keys.ShardKeys(0).fleet, "busy:sim") == "0"  # its slot was given back
    assert store.redis.hgetall(ProviderKeys("comfyui").budget) == {}  # no retry token spent
    assert store.ledger("acme")["reserved"] == 30 and store.ledger("acme")["settled"] == 0
    assert [(a["state"], a["server"]) for a in store.attempts(job_id)] == [("not_sent", "sim")]
    assert job["attempts_not_sent"] == "1"  # its view counts no submission


def test_sweeper_publishes_what_admission_never_sent(store, settings, broker, tenant) -> None:
    tenant()

    def crash(job_id: str, priority: str) -> None:
        raise ConnectionError("process died before actor.send")

    admitter = Admitter(store, crash, settings)
    body = {"kind": "image", "workflow": {"1": {}}, "outputs": 1}
    first = admitter.submit("acme", "k", body)  # admitted: the answer is 202 even though the send failed
    assert (first.status, first.replayed) == (202, False)
    with pytest.raises(IdempotencyConflict):
        admitter.submit("acme", "k", body)
    queue_key = "dramatiq:reckon-interactive"
    assert broker.client.llen(queue_key) == 0
    sweeper = Sweeper(store, Publisher(broker), settings, clock=lambda: time.time() + settings.outbox_grace_seconds)
    assert sweeper.sweep_once() == {"republished": 1}
    assert broker.client.llen(queue_key) == 1
    assert sweeper.sweep_once()["republished"] == 0
    replay = admitter.submit("acme", "k", body)
    assert replay.replayed and replay.status == 202


def test_a_worker_reads_a_servers_epoch_for_its_submissions_at_most_every_few_seconds(
        store, admit, make_executor, sim) -> None:
    """The epoch recorded with a submission may be a few seconds old (the checks that compare it read the
    server's afresh); every submission within EPOCH_READ_S of a read records that read's epoch."""
    executor = make_executor(sim)
    provider = executor.fleet["sim"]
    reads: list[str] = []
    read = provider.epoch
    provider.epoch = lambda: reads.append(read()) or reads[-1]
    jobs = [admit(key=f"k{n}") for n in range(3)]
    for job_id in jobs:
        assert executor.run(job_id) is True
    assert len(reads) == 1  # one read for the three submissions
    assert [store.job(job_id)["state"] for job_id in jobs] == ["completed"] * 3
