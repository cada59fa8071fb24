"""The fleet: dispatch caps taken atomically with the claim, parking, the watcher hand-off and
collect, all against real simulated servers, a real Dramatiq worker and a real redis-server."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Iterator

import dramatiq
import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed
from pipeline.fleet import Server
from pipeline.operate import cli
from pipeline.providers import sim as simulated
from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.state import keys
from pipeline.state.jobs import job_view
from pipeline.state.progress import events_after, record
from pipeline.state.status import audit
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from pipeline.work.watcher import Watcher
from tests.conftest import wait_until
from tests.pipeline.conftest import InProcess

CAPS = {"a": 2, "b": 2, "c": 2}


@pytest.fixture
def sims() -> Iterator[dict[str, simulated.SimServer]]:
    servers = {name: simulated.start(delay=1.5) for name in CAPS}
    yield servers
    for server in servers.values():
        server.close()


def fleet_of(sims: dict[str, simulated.SimServer]) -> Fleet:
    servers = [Server(name, sims[name].url, CAPS[name]) for name in sims]
    return Fleet(servers, lambda s: ComfyUI(HttpTransport(s.url, timeout=5), price_per_output=10))


def in_flight(sims: dict[str, simulated.SimServer]) -> int:
    return sum(len(s.sim.pending) + (s.sim.running is not None) for s in sims.values())


def charges(sims: dict[str, simulated.SimServer]) -> Counter[str]:
    return Counter(c["prompt_id"] for s in sims.values() for c in s.sim.charges)


def in_order(admit, *idempotency_keys: str) -> list[str]:
    """Jobs admitted a few milliseconds apart: equal admission times rank in any order."""
    jobs = []
    for key in idempotency_keys:
        jobs.append(admit(key))
        time.sleep(0.003)
    return jobs


def test_caps_hold_with_sixteen_threads_claiming_at_once(store, admit) -> None:
    jobs = [admit(f"k{n}") for n in range(40)]
    claims, start = [], threading.Barrier(16)

    def claimer(mine: list[str]) -> None:
        start.wait()
        for job_id in mine:
            claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{job_id}", servers=CAPS)
            if claim is not None:
                claims.append(claim)

    threads = [threading.Thread(target=claimer, args=(jobs[n::16],)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(claim.server for claim in claims) == {"a": 2, "b": 2, "c": 2}
    assert {name: view["busy"] for name, view in store.fleet(CAPS).items()} == CAPS
    parked = store.redis.zrange(keys.ShardKeys(0).parked, 0, -1)
    assert len(parked) == 34 and {store.job(j)["state"] for j in parked} == {"queued"}
    assert {store.job(j).get("attempt_count", "0") for j in parked} == {"0"}  # no attempt used
    store.finish(claims[0], "failed", error_class="test")
    assert store.unpark(keys.ShardKeys(0), CAPS) == [parked[0]]  # one slot: the oldest parked job, promised the slot
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # until it claims, no other job is called for the same slot
    newcomer = admit("k99")
    assert store.claim(newcomer, worker="w", lease_ms=60_000, operation_id="new", servers=CAPS) is None
    again = store.claim(parked[0], worker="w", lease_ms=60_000, operation_id="again", servers=CAPS)
    assert again is not None and again.server == claims[0].server
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # full again: nothing is published to bounce


def test_dispatch_takes_the_least_loaded_server_then_turns(store, admit) -> None:
    jobs = [admit(f"k{n}") for n in range(4)]
    servers = [store.claim(j, worker="w", lease_ms=60_000, operation_id=j, servers=CAPS).server for j in jobs]
    assert sorted(servers[:3]) == ["a", "b", "c"]  # each empty server once before any gets a second
    store.block_provider(servers[3], "dispatch_paused")
    job = admit("k9")
    assert store.claim(job, worker="w", lease_ms=60_000, operation_id=job, servers=CAPS).server not in servers[3]


def test_six_prompts_in_flight_with_four_worker_threads(store, settings, admit, broker, sims) -> None:
    """3 servers of cap 2 and 4 threads: the threads are free while prompts render, so all 6 slots fill."""
    settings = dataclasses.replace(settings, watch=True, watch_poll_seconds=0.2,
                                   progress_interval_seconds=0)  # every point written (test_watcher.py coalesces)
    fleet = fleet_of(sims)
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    actors.use(executor)
    jobs = [admit(f"k{n}") for n in range(9)]
    watcher, stop = Watcher(fleet, store, Publisher(broker), settings,
                            lambda *point: record(store.scripts, *point)), threading.Event()
    watching = threading.Thread(target=watcher.run, args=(stop,))
    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    watching.start()
    worker.start()
    peak = 0
    try:
        def done() -> bool:
            nonlocal peak
            peak = max(peak, in_flight(sims))
            return all(store.job(j)["state"] == "completed" for j in jobs)

        wait_until(done, timeout=40, interval=0.01)
    finally:
        worker.stop()
        stop.set()
        watching.join()
        actors.use(None)
    assert peak == 6
    assert sorted(charges(sims).values()) == [1] * 9  # one execution per job
    assert sum(len(s.sim.charges) for s in sims.values()) == 9
    assert {store.attempts(j)[0]["server"] for j in jobs} == {"a", "b", "c"}
    assert {name: view["busy"] for name, view in store.fleet(CAPS).items()} == {"a": 0, "b": 0, "c": 0}
    # a finished job keeps its state events, not its progress points; these took seq 3 to 6 while it ran
    assert [(e["type"], e["seq"]) for e in events_after(store.redis, jobs[0])] == [
        ("state", 1), ("state", 2), ("state", 7)]
    assert store.ledger("acme")["settled"] == 90 and store.ledger("acme")["reserved"] == 0


def test_a_cancel_takes_the_prompt_off_the_server_or_interrupts_it(store, settings, admit, broker) -> None:
    server = simulated.start(delay=3.0)
    try:
        with InProcess(store, settings, broker, {"a": server}):
            jobs = {admit("k1"), admit("k2")}
            wait_until(lambda: server.sim.running is not None and len(server.sim.pending) == 1)
            [pending] = [j for j in jobs if store.job(j)["operation_id"] == server.sim.pending[0][1]]
            [running] = jobs - {pending}
            assert store.cancel(pending)[0] == "running"  # at the server, waiting behind the other
            wait_until(lambda: store.job(pending)["state"] == "cancelled", timeout=10)
            assert server.sim.pending == [] and store.job(running)["state"] == "running"
            assert store.cancel(running)[0] == "running"
            wait_until(lambda: store.job(running)["state"] == "cancelled", timeout=10)
    finally:
        server.close()
    assert store.job(pending)["error_reason"] == "removed_from_provider_queue"
    assert store.job(running)["error_reason"] == "provider_interrupted"
    assert server.sim.charges == [] and server.sim.history.keys() == {store.attempts(running)[-1]["operation_id"]}
    assert store.ledger("acme")["settled"] == 0 and store.ledger("acme")["reserved"] == 0


def test_a_server_that_restarts_mid_render_sends_its_prompt_to_review(store, settings, admit, broker) -> None:
    server = simulated.start(delay=2.0)
    try:
        with InProcess(store, settings, broker, {"a": server}):
            job_id = admit()
            wait_until(lambda: store.job(job_id).get("lease_owner") == "watcher")
            server.sim.restart()  # its queue and history are gone, and it is a new process life
            wait_until(lambda: store.job(job_id)["state"] == "needs_review", timeout=20)
    finally:
        server.close()
    job = store.job(job_id)
    assert (job["error_class"], job["error_reason"]) == ("needs_review", "outcome_unknowable")
    assert job["uncertain"] == "10" and server.sim.charges == []  # held as uncertain: an operator decides
    assert store.fleet(CAPS)["a"]["busy"] == 0


def test_an_unreachable_server_is_skipped_probed_and_put_back(store, settings, admit, broker, sim) -> None:
    gone = simulated.start()
    port = gone.server_address[1]
    gone.close()  # refuses connections from now on
    with InProcess(store, settings, broker, {"a": gone, "b": sim}) as stack:
        stack.watcher.watches[0].settings = dataclasses.replace(stack.settings, probe_seconds=0.1)
        jobs = [admit(f"k{n}") for n in range(4)]
        wait_until(lambda: all(store.job(j)["state"] == "completed" for j in jobs), timeout=20)
        assert store.provider_block("a") == "provider_unreachable"
        refused = [a for j in jobs for a in store.attempts(j) if a["server"] == "a"]
        assert refused and {(a["state"], a["error_class"]) for a in refused} == {("not_sent", "connect_failed")}
        assert {store.job(j)["attempts_allowed"] for j in jobs} <= {"3", "4"}  # a refused attempt is given back
        for j in jobs:  # listed, but the job's attempt_count counts submissions only: each ran once, on b
            assert job_view(store.job(j), {})["attempt_count"] == 1
            assert [a["server"] for a in store.attempts(j) if a["state"] != "not_sent"] == ["b"]
        back = simulated.start(port=port)
        try:
            wait_until(lambda: store.provider_block("a") is None, timeout=10)  # the watcher's probe answered
            store.block_provider("b", "dispatch_paused")
            late = admit("k9")
            wait_until(lambda: store.job(late)["state"] == "completed", timeout=10)
        finally:
            back.close()
    assert [a["server"] for a in store.attempts(late)] == ["a"]
    assert len(sim.sim.charges) == 4 and len(back.sim.charges) == 1
    assert store.redis.hget(keys.ProviderKeys("comfyui").budget, "tokens") == "100"  # no retry token spent


def test_a_duplicated_collect_message_collects_once(store, settings, admit) -> None:
    server = simulated.start(delay=0.3)
    try:
        fleet = fleet_of({"a": server})
        executor = Executor(store, fleet, BlobStore(settings.blob_dir), dataclasses.replace(settings, watch=True))
        job_id = admit(outputs=2)
        assert executor.run(job_id) is True and store.job(job_id)["lease_owner"] == "watcher"
        wait_until(lambda: store.job(job_id)["operation_id"] in server.sim.history)
        start, results = threading.Barrier(2), []

        def collect() -> None:
            start.wait()
            results.append(executor.collect(job_id))

        threads = [threading.Thread(target=collect) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert executor.collect(job_id) is False  # and a third, after the job finished
    finally:
        server.close()
    assert sorted(results) == [False, True]
    assert store.job(job_id)["state"] == "completed" and sorted(store.outputs(job_id)) == [0, 1]
    assert len(server.sim.charges) == 1 and store.ledger("acme")["settled"] == 20
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "completed"]


class Refusing:
    """Takes the prompt but refuses one output node (a 200 with node_errors); the prompt still runs
    at the first status read, then completes with one image of the two requested."""

    name, price_per_output, client_id = "comfyui", 10, "reckon"

    def __init__(self) -> None:
        self.reads = 0

    def submit(self, operation_id, workflow, indices, *, front=False):
        return {"node_id": "7", "class_type": "SaveImage", "error_type": "bad_output", "message": "refused"}

    def cancel(self, operation_id) -> None:
        pass

    def status(self, operation_id) -> OperationStatus:
        self.reads += 1
        return OperationStatus("running") if self.reads == 1 else OperationStatus(
            "completed", outputs=[OutputRef(0, "a.png")])

    def fetch(self, ref) -> bytes:
        return simulated.png("x")

    def epoch(self) -> str:
        return ""

    def offers(self) -> None:  # does not say what it can run: taken to run anything
        return None


def test_a_refusal_at_submission_survives_hand_backs_and_names_the_failure(store, settings, admit) -> None:
    fleet = Fleet([Server("a", "http://a", 2)], lambda _: Refusing())
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), dataclasses.replace(settings, watch=True))
    job_id = admit(outputs=2)
    assert executor.run(job_id) is True
    assert executor.collect(job_id) is True  # still running: handed back to the watcher
    with pytest.raises(AttemptFailed) as failure:
        executor.collect(job_id)
    assert Router(store, settings, rng=lambda: 1.0).route(failure.value) == "dead_letter"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["error_reason"]) == (
        "failed", "execution_failed", "provider_refused_output_nodes")
    assert orjson.loads(job["error_detail"])["node_id"] == "7" and job["settled"] == "10"  # one image made


def test_no_lease_is_renewed_past_the_deadline(store, settings, admit, broker) -> None:
    server = simulated.start(delay=30.0)  # a prompt that runs (or hangs) far beyond the job's deadline
    try:
        with InProcess(store, settings, broker, {"a": server}):
            job_id = admit(deadline_s=2)
            wait_until(lambda: store.job(job_id).get("lease_owner") == "watcher")
            wait_until(lambda: store.job(job_id)["state"] == "reconciling", timeout=15)
    finally:
        server.close()
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling"]
    assert store.fleet(CAPS)["a"]["busy"] == 1  # the prompt may still occupy the server
    assert len(server.sim.charges) == 0


class RestartsOnCancel(ComfyUI):
    """The prompt finishes, then the server restarts (history lost), just before our cancel lands."""

    def __init__(self, server: simulated.SimServer) -> None:
        super().__init__(HttpTransport(server.url, timeout=5), price_per_output=10)
        self.server = server

    def cancel(self, operation_id: str) -> None:
        wait_until(lambda: operation_id in self.server.sim.history)
        self.server.sim.restart()
        super().cancel(operation_id)


def test_a_cancel_never_takes_a_prompt_lost_in_a_restart_for_never_run(store, settings, admit) -> None:
    server = simulated.start(delay=0.5)
    try:
        fleet = Fleet([Server("a", server.url, 2)], lambda _: RestartsOnCancel(server))
        executor = Executor(store, fleet, BlobStore(settings.blob_dir), dataclasses.replace(settings, watch=True))
        job_id = admit()
        assert executor.run(job_id) is True
        store.cancel(job_id)
        with pytest.raises(AttemptFailed) as failure:
            executor.collect(job_id)
        assert Router(store, settings).route(failure.value) == "reconcile"
        assert executor.reconcile(job_id) is True
    finally:
        server.close()
    job = store.job(job_id)
    assert (job["state"], job["error_reason"], job["uncertain"]) == ("needs_review", "outcome_unknowable", "10")
    assert len(server.sim.charges) == 1  # it ran: the cost is held, not released


def test_a_paused_class_waits_and_loses_duplicates_or_charges_nothing(store, settings, admit, broker, capsys) -> None:
    server = simulated.start(delay=1.0)
    try:
        with InProcess(store, settings, broker, {"a": server}):
            first = admit("i0")
            wait_until(lambda: store.job(first).get("lease_owner") == "watcher")  # at the server
            assert cli.main(["pause", "--class", "interactive"], store=store) == 0
            waiting = [admit(f"i{n}") for n in range(1, 4)]  # admission goes on
            batch = [admit(f"b{n}", priority="batch") for n in range(2)]
            wait_until(lambda: all(store.job(j)["state"] == "completed" for j in [first, *batch]), timeout=20)
            assert [(store.job(j)["state"], store.job(j).get("attempt_count", "0")) for j in waiting] == [
                ("queued", "0")] * 3
            assert len(server.sim.charges) == 3  # the one at the server was seen through; batch ran
            assert orjson.loads(capsys.readouterr().out)["paused"] == {"class": "interactive"}
            assert cli.main(["status", "--json"], store=store) == 0
            shown = orjson.loads(capsys.readouterr().out)["classes"]
            assert [(cls, row["paused"], row["depth"]) for cls, row in shown.items()] == [
                ("interactive", True, 3), ("batch", False, 0)]
            assert cli.main(["status"], store=store) == 0
            assert "PAUSED" in capsys.readouterr().out.splitlines()[1]  # the interactive row
            assert cli.main(["resume", "--class", "interactive"], store=store) == 0
            wait_until(lambda: all(store.job(j)["state"] == "completed" for j in waiting), timeout=20)
    finally:
        server.close()
    assert sorted(Counter(c["prompt_id"] for c in server.sim.charges).values()) == [1] * 6
    assert store.ledger("acme")["settled"] == 60 and store.ledger("acme")["reserved"] == 0
    assert store.redis.zcard(keys.ShardKeys(0).parked) == 0
    assert audit(store.redis, ["acme"]) == []  # the global figures agree with the jobs


class PausesBeforeSending(ComfyUI):
    """The class is paused between the claim and the submission (while the epoch is read)."""

    def __init__(self, server: simulated.SimServer, store) -> None:
        super().__init__(HttpTransport(server.url, timeout=5), price_per_output=10)
        self.store = store

    def epoch(self) -> str:
        self.store.pause_class("interactive")
        return super().epoch()

    def offers(self) -> None:  # does not say what it can run: taken to run anything
        return None


def test_a_pause_after_the_claim_sends_nothing_and_gives_the_attempt_back(store, settings, admit, sim) -> None:
    fleet = Fleet([Server("a", sim.url, 2)], lambda _: PausesBeforeSending(sim, store))
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    job_id = admit()
    assert executor.run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["attempts_allowed"]) == ("retry_wait", "dispatch_paused", "4")
    assert sim.sim.charges == [] and store.fleet({"a": 2})["a"]["busy"] == 0


