"""Per-second prices (docs/costs.md "Per-second prices"): a job's seconds are bounded at admission, each
attempt is booked by its server's own execution timestamps, and a prompt past its ``max_seconds`` is
interrupted and booked for what ran, all against the simulated ComfyUI's charge ledger, to the unit."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed, InvalidRequest
from pipeline.fleet import attempt_ceiling, parse
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.comfyui_answers import from_history
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.progress import record
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from pipeline.work.watcher import ServerWatch
from tests.conftest import wait_until
from tests.pipeline.test_failures import inject

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}
ALLOWANCE = 10_000
PRICE, PER_SECOND = 2, 5  # per output, per second of execution


@pytest.fixture
def per_second():
    server = simulated.start(price_per_output=PRICE, price_per_second=PER_SECOND, cache=True)
    yield server
    server.close()


def parts(store: Store, settings: Settings, server: simulated.SimServer, **options: Any) -> tuple[
        Admitter, Executor, Router, Settings]:
    settings = dataclasses.replace(settings, retry_base_seconds=0.0, **options,
                                   providers=f"sim={server.url};price={PRICE};price_per_second={PER_SECOND}")
    fleet = Fleet(settings.servers(), lambda s: ComfyUI(HttpTransport(s.url, timeout=5),
                                                        price_per_output=s.price_per_output))
    if not store.redis.exists(TenantKeys("acme").ledger):
        create_tenant(store.redis, "acme", ALLOWANCE)
    return (Admitter(store, lambda job_id, priority: None, settings),
            Executor(store, fleet, BlobStore(settings.blob_dir), settings), Router(store, settings, rng=lambda: 1.0),
            settings)


def submit(admit: Admitter, key: str, workflow: dict[str, Any] = WORKFLOW, **body: Any) -> str:
    return admit.submit("acme", key, {"kind": "image", "workflow": workflow, "outputs": 1, **body}).job_id


def balanced(store: Store) -> dict[str, int]:
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    return ledger


def charges(server: simulated.SimServer) -> dict[str, dict[str, Any]]:
    return {c["prompt_id"]: c for c in server.sim.charges}


def test_the_seconds_are_bounded_at_admission_or_the_job_is_refused(store, settings, per_second) -> None:
    """A per-second server with no max_seconds anywhere: 422 max-seconds-required, nothing reserved; the
    request's max_seconds, or its class's default, bounds the ceiling: outputs x 2 + seconds x 5, x 3."""
    admit, _, _, _ = parts(store, settings, per_second)
    with pytest.raises(InvalidRequest) as refused:
        submit(admit, "no-bound")
    assert (refused.value.problem, refused.value.field) == ("max-seconds-required", "max_seconds")
    assert balanced(store)["reserved"] == 0
    bounded = submit(admit, "bounded", max_seconds=4)
    job = store.job(bounded)
    assert (job["max_seconds"], job["price_per_second"], job["per_attempt"], job["ceiling"]) == ("4", "5", "22", "66")
    admit_default, _, _, _ = parts(store, settings, per_second, max_seconds_batch=10)
    by_class = store.job(submit(admit_default, "by-class", priority="batch"))
    assert (by_class["max_seconds"], by_class["ceiling"]) == ("10", str((2 + 50) * 3))
    assert balanced(store)["reserved"] == 66 + 156
    with pytest.raises(InvalidRequest):  # an interactive job has no default here
        submit(admit_default, "interactive")


def test_each_job_is_settled_what_the_server_charged_for_its_seconds(store, settings, per_second) -> None:
    """Three jobs of different run times (0.1, 0.4, 0.8 s) on a server at 2 per output and 5 per second:
    every job is settled exactly what the server's ledger charged its prompt (its own timestamps), its
    attempt records the milliseconds booked, and the tenant is settled the ledger's total."""
    admit, executor, _, _ = parts(store, settings, per_second)
    jobs = []
    for n, delay in enumerate((0.1, 0.4, 0.8)):
        per_second.sim.delay = delay
        job_id = submit(admit, f"k{n}", {"3": {"class_type": "KSampler", "inputs": {"seed": n}}}, max_seconds=5)
        assert executor.run(job_id)
        jobs.append(job_id)
    ledger = charges(per_second)
    for job_id, delay in zip(jobs, (0.1, 0.4, 0.8)):
        job = store.job(job_id)
        [run] = store.attempts(job_id)
        charge = ledger[run["operation_id"]]
        assert delay * 1000 <= charge["ms"] < delay * 1000 + 1000
        assert charge["units"] == PRICE + -(-charge["ms"] * PER_SECOND // 1000)
        assert (job["state"], job["settled"], job["reserved"], job["uncertain"]) == (
            "completed", str(charge["units"]), "0", "0")
        assert run["seconds_ms"] == charge["ms"]
        packed = orjson.loads(store.redis.hget(JobKeys(job_id).record, "z"))  # finished: packed, the attempt
        assert len(packed[4][0]) == 13 and packed[4][0][12] == charge["ms"]  # as its 13 values, seconds_ms last
    total = sum(c["units"] for c in per_second.sim.charges)
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": total,
                               "available": ALLOWANCE - total}


def test_a_prompt_past_its_max_seconds_is_interrupted_and_booked_for_what_ran(store, settings, per_second) -> None:
    """A prompt that would run 4 s with max_seconds 1 is interrupted at the server about a second after it
    started; the job fails max_seconds_exceeded (not retried: a retry would run as long), settled the
    seconds the server billed (no output), and its attempt shows those seconds."""
    admit, executor, router, _ = parts(store, settings, per_second)
    per_second.sim.delay = 4.0
    job_id = submit(admit, "slow", max_seconds=1)
    with pytest.raises(AttemptFailed) as failed:
        executor.run(job_id)
    assert router.route(failed.value) == "dead_letter"  # failed for good, never retried
    job = store.job(job_id)
    [run] = store.attempts(job_id)
    [charge] = per_second.sim.charges
    assert (charge["prompt_id"], charge["outputs"]) == (run["operation_id"], 0)
    assert 1000 <= charge["ms"] < 4000  # interrupted: it did not run its 4 s
    assert (job["state"], job["error_class"], job["error_reason"]) == ("failed", "execution_failed",
                                                                       "max_seconds_exceeded")
    assert (job["settled"], run["seconds_ms"]) == (str(charge["units"]), charge["ms"])
    assert charge["units"] == -(-charge["ms"] * PER_SECOND // 1000)
    assert balanced(store)["settled"] == charge["units"]


def test_a_cached_run_costs_only_what_executed(store, settings, per_second) -> None:
    """The same graph twice on a caching server: the second prompt executes nothing (its start and end
    a few ms apart), and is booked its outputs and those few ms, what the server charged."""
    admit, executor, _, _ = parts(store, settings, per_second)
    per_second.sim.delay = 0.6
    first, second = submit(admit, "first", max_seconds=5), submit(admit, "second", max_seconds=5)
    assert executor.run(first) and executor.run(second)
    ledger = charges(per_second)
    runs = [store.attempts(job_id)[0] for job_id in (first, second)]
    ran, cached = (ledger[run["operation_id"]] for run in runs)
    assert ran["ms"] >= 600 and cached["ms"] < 300
    assert [store.job(j)["settled"] for j in (first, second)] == [str(ran["units"]), str(cached["units"])]
    assert cached["units"] == PRICE + -(-cached["ms"] * PER_SECOND // 1000) < ran["units"]
    assert [run["seconds_ms"] for run in runs] == [ran["ms"], cached["ms"]]


def test_an_unknown_outcome_holds_the_seconds_bound_until_the_servers_report_replaces_it(
        store, settings, per_second) -> None:
    """The server runs the prompt, then its answer is lost: the hold is a whole run, 1 output x 2 plus
    max_seconds 5 x 5 = 27 uncertain; reconciliation reads the history and books what was charged."""
    admit, executor, router, _ = parts(store, settings, per_second)
    per_second.sim.delay = 0.2
    job_id = submit(admit, "lost", max_seconds=5)
    inject(per_second, {"kind": "error_after"})
    with pytest.raises(AttemptFailed) as failed:
        executor.run(job_id)
    assert router.route(failed.value) == "reconcile"
    job = store.job(job_id)
    assert (job["state"], job["uncertain"], job["reserved"]) == ("reconciling", "27", str(81 - 27))
    assert balanced(store)["uncertain"] == 27
    wait_until(lambda: per_second.sim.charges)
    wait_until(lambda: executor.reconcile(job_id) and store.job(job_id)["state"] == "completed")
    [charge] = per_second.sim.charges
    assert (store.job(job_id)["settled"], store.job(job_id)["uncertain"]) == (str(charge["units"]), "0")
    assert balanced(store)["settled"] == charge["units"]


class Counting(ComfyUI):
    """The real adapter, counting the cancels it is asked for."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.cancels: list[str] = []

    def cancel(self, operation_id: str) -> None:
        self.cancels.append(operation_id)
        super().cancel(operation_id)


def test_the_watcher_interrupts_a_prompt_past_its_max_seconds_and_the_collect_books_it(
        store, settings, per_second) -> None:
    """Watched (the worker handed the prompt over): the watcher, on its own clock (kept behind the real
    one, as a watcher hears of a start after it happened), interrupts the prompt max_seconds after its
    execution_start, once; the collect books what ran in its claim (the seconds
    the server billed) and fails the job max_seconds_exceeded."""
    admit, _, router, settings = parts(store, settings, per_second, watch=True)
    provider = Counting(HttpTransport(per_second.url, timeout=5), price_per_output=PRICE)
    fleet = Fleet(settings.servers(), lambda s: provider)
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    now = [1000.0]
    watch = ServerWatch("sim", fleet, store, lambda job, why: None, settings,
                        lambda *point: record(store.scripts, *point), lambda: now[0])
    per_second.sim.delay = 6.0
    job_id = submit(admit, "watched", max_seconds=1)
    assert executor.run(job_id)  # submitted and handed over
    entry = store.watch_entry(job_id)
    assert entry["max"] == 1
    wait_until(lambda: per_second.sim.running is not None)
    started = time.monotonic()
    watch.on_message(orjson.dumps({"type": "execution_start", "data": {"prompt_id": entry["op"]}}).decode())
    now[0] += 0.9
    watch.tick()
    assert provider.cancels == []
    wait_until(lambda: time.monotonic() - started >= 1.0)  # the server's own clock has run the second too
    now[0] += settings.watch_poll_seconds  # the next tick is due: 0.9 s + an interval is past the second
    watch.tick()
    assert provider.cancels == [entry["op"]]
    now[0] += 5.0
    watch.tick()
    assert provider.cancels == [entry["op"]]  # once
    wait_until(lambda: per_second.sim.charges)
    with pytest.raises(AttemptFailed) as failed:
        executor.collect(job_id)
    assert router.route(failed.value) == "dead_letter"  # failed for good, never retried
    [charge] = per_second.sim.charges
    job = store.job(job_id)
    assert (job["state"], job["error_reason"], job["settled"]) == ("failed", "max_seconds_exceeded",
                                                                   str(charge["units"]))
    assert store.attempts(job_id)[0]["seconds_ms"] == charge["ms"] < 6000


def test_a_server_may_be_priced_by_the_second_alone_and_an_attempts_ceiling_is_its_dearest_server() -> None:
    a, b = parse("a=http://a;price=0;price_per_second=3,b=http://b;price=10", default_url="", cap=2, price=10)
    assert (a.price_per_output, a.price_per_second, b.price_per_second) == (0, 3, 0)
    assert attempt_ceiling([a, b], 2, 30) == 90  # a: 0 + 30 x 3; b: 2 x 10
    assert attempt_ceiling([a, b], 2, 0) == 20
    with pytest.raises(ValueError):
        parse("a=http://a;price=0", default_url="", cap=2, price=10)


def test_seconds_come_from_the_servers_own_messages_and_without_them_the_bound_is_booked() -> None:
    """execution_start to the end message's timestamp; a history without timestamps (an older server)
    has no seconds, and its run is booked at max_seconds, the bound the tenant authorized."""
    def entry(*messages: list[Any]) -> dict[str, Any]:
        return {"status": {"status_str": "success", "completed": True, "messages": list(messages)},
                "outputs": {"9": {"images": [{"filename": "a.png", "subfolder": "", "type": "output"}]}}}

    timed = from_history(entry(["execution_start", {"prompt_id": "p", "timestamp": 1_000}],
                               ["execution_cached", {"nodes": [], "prompt_id": "p", "timestamp": 1_001}],
                               ["execution_success", {"prompt_id": "p", "timestamp": 13_345}]))
    older = from_history(entry(["execution_start", {"prompt_id": "p"}], ["execution_success", {"prompt_id": "p"}]))
    assert (timed.seconds_ms, older.seconds_ms) == (12_345, None)
    [server] = parse("s=http://s;price=2;price_per_second=5", default_url="", cap=2, price=10)
    assert timed.cost(server, 30) == (2 + 62, 12_345)  # ceil(61.725): the worked example of docs/costs.md
    assert older.cost(server, 30) == (2 + 150, 30_000)
    [per_output] = parse("s=http://s;price=2", default_url="", cap=2, price=10)
    assert timed.cost(per_output, 30) == (2, None)  # no price per second: no seconds booked


def test_reversed_or_unreadable_timestamps_book_the_bound_never_less() -> None:
    """An end stamped before its start (a server clock stepped back) gives no seconds, as a history
    without timestamps: the run is booked max_seconds, never 0 (docs/costs.md "No timestamps")."""
    def entry(start: Any, end: Any) -> dict[str, Any]:
        return {"status": {"status_str": "success", "completed": True, "messages": [
            ["execution_start", {"prompt_id": "p", "timestamp": start}],
            ["execution_success", {"prompt_id": "p", "timestamp": end}]]}, "outputs": {}}

    [server] = parse("s=http://s;price=0;price_per_second=5", default_url="", cap=2, price=10)
    reversed_ = from_history(entry(13_345, 1_000))
    assert reversed_.seconds_ms is None
    assert reversed_.cost(server, 30) == (150, 30_000)
    for start, end in ((-5, 1_000), (1_000, True), (1_000.5, 2_000), ("1000", 2_000), (None, 2_000)):
        assert from_history(entry(start, end)).cost(server, 30) == (150, 30_000), (start, end)
    assert from_history(entry(1_000, 1_000)).cost(server, 30) == (0, 0)  # executed nothing: costs nothing


def test_a_prompt_still_running_past_its_deadline_is_interrupted_at_max_seconds_by_reconciliation(
        store, settings, per_second) -> None:
    """The deadline (1 s) passes while the prompt runs: the worker's wait gives it to reconciliation,
    which no longer had a bound on it (a 4 s run of a job of max_seconds 2 ran and was booked whole)."""
    admit, executor, router, _ = parts(store, settings, per_second, min_attempt_seconds=0)
    per_second.sim.delay = 4.0
    job_id = submit(admit, "late", max_seconds=2, deadline_s=1)
    with pytest.raises(AttemptFailed) as failed:
        executor.run(job_id)
    assert router.route(failed.value) == "reconcile"

    def reconciled() -> bool:
        try:
            executor.reconcile(job_id)
        except AttemptFailed as ended:  # reckon's own stop: failed for good, never retried
            assert router.route(ended) == "dead_letter"
        return store.job(job_id)["state"] != "reconciling"
    wait_until(reconciled, timeout=20)
    [charge] = per_second.sim.charges
    assert 2_000 <= charge["ms"] < 4_000  # interrupted: it did not run its 4 s
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["error_reason"]) == ("failed", "execution_failed",
                                                                       "max_seconds_exceeded")
    assert int(job["settled"]) == charge["units"] == balanced(store)["settled"]
    assert store.attempts(job_id)[0]["seconds_ms"] == charge["ms"]
