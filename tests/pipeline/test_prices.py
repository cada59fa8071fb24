"""The price a server charges is the price the tenant is booked: a fleet whose servers charge
different prices, every job's reservation, hold, charge and settlement against what each server
itself charged (the simulated provider's charge ledger, or a scripted provider's)."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.blobs.local import BlobStore
from pipeline.operate import cli
from pipeline.errors import AttemptFailed, InvalidRequest, OperationFailed, UnknownOutcome
from pipeline.providers import sim as simulated
from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.jobs import job_view
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from tests.conftest import wait_until
from tests.pipeline.test_failures import inject, units

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}
ALLOWANCE = 10_000
STATS = keys.ShardKeys(0).stats


def admitter(store: Store, settings: Settings) -> Admitter:
    create_tenant(store.redis, "acme", ALLOWANCE)
    return Admitter(store, lambda job_id, priority: None, settings)


def submit(admit: Admitter, key: str, outputs: int, **body: Any) -> str:
    return admit.submit("acme", key, {"kind": "image", "workflow": WORKFLOW, "outputs": outputs, **body}).job_id


def attempt(executor: Executor, router: Router, job_id: str) -> str:
    try:
        return "done" if executor.run(job_id) else "skipped"
    except AttemptFailed as failed:
        return router.route(failed)


def reconcile(executor: Executor, router: Router, job_id: str) -> str:
    try:
        return "reconciled" if executor.reconcile(job_id) else "skipped"
    except AttemptFailed as failed:
        return router.route(failed)


def only(store: Store, server: str, servers: tuple[str, ...]) -> None:
    """Dispatch goes to ``server`` alone: every other server is paused."""
    for other in servers:
        if other == server:
            store.clear_provider(other)
        else:
            store.block_provider(other, "dispatch_paused")


def balanced(store: Store) -> dict[str, int]:
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    return ledger


@pytest.fixture
def two_sims():
    servers = {"a": simulated.start(price_per_output=10), "b": simulated.start(price_per_output=12)}
    yield servers
    for server in servers.values():
        server.close()


def test_a_two_server_fleet_books_each_run_at_the_price_of_its_server(store, settings, two_sims) -> None:
    """Server a charges 10 per output, b 12, the global price is 10: every job is reserved at 12, each
    run is booked at its own server's price, a hold of an unknown outcome on b is held at 12, and every
    job and the tenant are settled exactly what the two servers' charge ledgers say."""
    a, b = two_sims["a"], two_sims["b"]
    settings = dataclasses.replace(settings, price_per_output=10, retry_base_seconds=0.0,
                                   providers=f"a={a.url};price=10,b={b.url};price=12")
    fleet = Fleet(settings.servers(), lambda s: ComfyUI(HttpTransport(s.url, timeout=5),
                                                        price_per_output=s.price_per_output))
    executor = Executor(store, fleet, BlobStore(settings.blob_dir), settings)
    router = Router(store, settings, rng=lambda: 1.0)
    admit = admitter(store, settings)
    with pytest.raises(InvalidRequest) as low:  # one attempt on b costs 12: 10 covers none
        submit(admit, "too-low", 1, max_cost=10)
    assert low.value.problem == "max-cost-too-low"

    on_b, on_a, dropped, capped = (submit(admit, "k1", 1), submit(admit, "k2", 2), submit(admit, "k3", 2),
                                   submit(admit, "k4", 1, max_cost=12))
    assert {j: (store.job(j)["price"], store.job(j)["ceiling"], store.job(j)["attempts_allowed"])
            for j in (on_b, on_a, dropped, capped)} == {
        on_b: ("12", "36", "3"), on_a: ("12", "72", "3"), dropped: ("12", "72", "3"), capped: ("12", "12", "1")}
    assert balanced(store)["reserved"] == 36 + 72 + 72 + 12

    only(store, "b", ("a", "b"))
    assert attempt(executor, router, on_b) == "done"
    assert attempt(executor, router, capped) == "done"
    inject(b, {"kind": "error_after"})  # b runs the prompt and charges it, then answers 500: unknown
    assert attempt(executor, router, dropped) == "reconcile"
    job = store.job(dropped)
    assert (job["state"], job["uncertain"], job["reserved"]) == ("reconciling", "24", "48")  # 2 missing x 12
    assert balanced(store)["uncertain"] == 24
    only(store, "a", ("a", "b"))
    assert attempt(executor, router, on_a) == "done"
    wait_until(lambda: reconcile(executor, router, dropped) == "reconciled"
               and store.job(dropped)["state"] == "completed")

    charged = {c["prompt_id"]: c["units"] for server in (a, b) for c in server.sim.charges}
    assert sorted(charged.values()) == [12, 12, 20, 24]
    for job_id, server, units in ((on_b, "b", 12), (capped, "b", 12), (dropped, "b", 24), (on_a, "a", 20)):
        job = store.job(job_id)
        [run] = store.attempts(job_id)
        assert (run["server"], run["price"], charged[run["operation_id"]]) == (server, {"a": 10, "b": 12}[server],
                                                                               units)
        assert (job["state"], job["reserved"], job["charged"], job["uncertain"], job["settled"]) == (
            "completed", "0", "0", "0", str(units))
        assert job_view(job, {})["cost"] == {"price": 12, "ceiling": int(job["ceiling"]), "reserved": 0,
                                             "uncertain": 0, "settled": units,
                                             "attempts": [{"attempt": 1, "server": server, "units": units}]}
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": 68,
                               "available": ALLOWANCE - 68}
    assert sum(c["units"] for server in (a, b) for c in server.sim.charges) == 68
    assert store.redis.hget(STATS, "charge_overruns_total") is None


def test_a_charge_beyond_what_the_job_holds_is_booked_in_full_counted_and_logged(store, settings, caplog) -> None:
    """A job reserved at 10 before a dearer server joined (price 12) runs there: the 12 spent are
    booked and settled, not cut to the 10 held; the overrun is counted and logged as an error."""
    create_tenant(store.redis, "acme", ALLOWANCE)
    admit = Admitter(store, lambda job_id, priority: None, settings)  # the fleet of one server at 10
    job_id = submit(admit, "k1", 1, max_cost=10)
    claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op-1", servers={"dear": 1})
    assert claim is not None
    with caplog.at_level(logging.ERROR, logger="pipeline.state.store"):
        assert store.charge(claim, 12) == 12
    job = store.job(job_id)
    assert (job["reserved"], job["charged"], job["overrun"]) == ("0", "12", "2")
    assert store.redis.hget(STATS, "charge_overruns_total") == "1"
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert error.getMessage() == f"charge overrun: job {job_id} attempt 1 on server dear charged 12 units, 2 more " \
                                 "than it held"
    assert store.charge(claim, 12) == 0  # once per attempt: nothing more, nothing counted again
    store.finish(claim, "failed", error_class="test")  # however it ends, what was spent is settled
    assert store.job(job_id)["settled"] == "12"
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": 12,
                               "available": ALLOWANCE - 12}
    assert store.redis.hget(STATS, "ledger:settled") == "12" and store.redis.hget(STATS, "ledger:reserved") == "0"
    assert store.redis.hget(STATS, "charge_overruns_total") == "1"


def test_an_unknown_run_beyond_what_the_job_holds_is_held_in_full(store, settings) -> None:
    """A job reserved at 10 (one output, max_cost 10) runs on a server at 12 that joined since: its outcome
    unknown, the whole run (12) is held, 2 of it beyond its reservation (the tenant's available units go
    down by them), and settled in full when it is taken as charged."""
    create_tenant(store.redis, "acme", ALLOWANCE)
    job_id = submit(Admitter(store, lambda job_id, priority: None, settings), "k1", 1, max_cost=10)
    claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op-1", servers={"dear": 1},
                        prices={"dear": 12})
    assert claim is not None
    store.mark_submit(claim, epoch="e1", lease_ms=60_000)
    assert store.begin_reconcile(job_id, reason="unknown_outcome", claim=claim)
    job = store.job(job_id)
    assert (job["state"], job["reserved"], job["uncertain"]) == ("reconciling", "0", "12")
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 12, "settled": 0,
                               "available": ALLOWANCE - 12}
    rec = store.claim_reconcile(job_id, worker="r", lease_ms=60_000)
    assert rec is not None
    assert store.resolve_uncertain(rec.claim, executed=True) == 12
    store.finish(rec.claim, "failed", error_class="possible_duplicate")
    assert (store.job(job_id)["state"], store.job(job_id)["settled"]) == ("failed", "12")
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": 12,
                               "available": ALLOWANCE - 12}


def test_a_retry_is_affordable_only_at_the_price_of_the_dearest_server_it_may_run_on(store, settings) -> None:
    """A job reserved at 10 (two attempts, 21 units) before server b, at 12, joined: its first run on a
    is charged 10 and fails, leaving 11. Another attempt may land on b, which 11 does not pay for: it
    is dead-lettered, not retried (at the global price of 10 it would have been)."""
    create_tenant(store.redis, "acme", ALLOWANCE)
    job_id = submit(Admitter(store, lambda job_id, priority: None, settings), "k1", 1, max_cost=21)
    assert (store.job(job_id)["price"], store.job(job_id)["attempts_allowed"]) == ("10", "2")
    claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op-1", servers={"a": 1, "b": 1})
    assert claim is not None
    store.charge(claim, 10)
    fleet = dataclasses.replace(settings, price_per_output=10,
                                providers="a=http://127.0.0.1:9;price=10,b=http://127.0.0.1:9;price=12")
    router = Router(store, fleet, rng=lambda: 0.0)
    assert router.route(AttemptFailed(claim, OperationFailed("provider_error"))) == "dead_letter"
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["settled"]) == ("failed", "reservation_exhausted", "10")
    assert balanced(store)["settled"] == 10


def test_an_unknowable_run_is_held_whole_as_the_provider_bills_it(store, admit, make_executor, make_router,
                                                                  capsys) -> None:
    """ComfyUI runs the whole graph for every prompt, whichever outputs reckon still lacks (the simulated
    server with graph_outputs=3 does the same): a retry for the two outputs a partial run left missing is
    billed all three. Its answer lost and the server restarted, its outcome is unknowable: the hold is the
    whole run (30 units), not the two missing outputs (20), so the tenant is settled what the server
    charged (40), never less; the ledger balances after every step."""
    server = simulated.start(graph_outputs=3)
    try:
        job_id = admit(outputs=3)
        executor, router = make_executor(server), make_router(retry_base_seconds=0.0)
        inject(server, {"kind": "partial", "produce": 1})
        assert attempt(executor, router, job_id) == "retry"
        assert (sorted(store.outputs(job_id)), units(server)) == ([0], [10])
        assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 90, "uncertain": 0, "settled": 0,
                                   "available": ALLOWANCE - 90}
        store.promote(job_id)
        inject(server, {"kind": "drop"})
        assert attempt(executor, router, job_id) == "reconcile"
        job = store.job(job_id)
        assert (job["state"], job["reserved"], job["charged"], job["uncertain"]) == ("reconciling", "50", "10", "30")
        assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 60, "uncertain": 30, "settled": 0,
                                   "available": ALLOWANCE - 90}
        wait_until(lambda: units(server) == [10, 30])  # the retry asked for [1, 2]; the graph made three
        server.sim.restart()
        assert reconcile(executor, router, job_id) == "reconciled"
        job = store.job(job_id)
        assert (job["state"], job["error_reason"], job["uncertain"]) == ("needs_review", "outcome_unknowable", "30")
        assert balanced(store)["uncertain"] == 30
        assert cli.main(["review", "resolve", job_id, "--failed"], store=store) == 0
        capsys.readouterr()
    finally:
        server.close()
    job = store.job(job_id)
    assert (job["state"], job["reserved"], job["charged"], job["uncertain"], job["settled"]) == (
        "failed", "0", "0", "0", "40")
    assert sum(units(server)) == 40
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": 40,
                               "available": ALLOWANCE - 40}


# -- the property: mixed prices, mixed outcomes ----------------------------------------------

class Billed:
    """An in-process provider at one price, with its own charge ledger: each prompt's outcome is
    scripted (``complete``; ``partial``: its first output made, then a retryable failure; ``drop``:
    it runs and is charged, the submission's answer is lost)."""

    name, client_id = "billed", ""

    def __init__(self, price: int, script: list[str]) -> None:
        self.price_per_output, self.script = price, script
        self.charges: dict[str, int] = {}
        self.status_of: dict[str, OperationStatus] = {}

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int], *,
               front: bool = False) -> None:
        outcome = self.script.pop(0) if self.script else "complete"
        made = indices[:1] if outcome == "partial" else indices
        refs = [OutputRef(i, f"{operation_id}-{i}", content_type="application/octet-stream") for i in made]
        self.charges[operation_id] = len(made) * self.price_per_output
        self.status_of[operation_id] = OperationStatus("failed" if outcome == "partial" else "completed", refs,
                                                       error="provider_error", produced=len(made))
        if outcome == "drop":
            raise UnknownOutcome("connection_dropped")

    def cancel(self, operation_id: str) -> None:
        pass

    def status(self, operation_id: str) -> OperationStatus:
        return self.status_of.get(operation_id, OperationStatus("unknown"))

    def fetch(self, ref: OutputRef) -> bytes:
        return simulated.png(ref.filename)

    def epoch(self) -> str:
        return "one-life"

    def offers(self) -> None:  # does not say what it can run: taken to run anything
        return None


PRICES = st.integers(1, 20)
JOB = st.tuples(st.integers(1, 3), st.one_of(st.none(), st.integers(1, 150)),
                st.lists(st.sampled_from(["complete", "partial", "drop"]), max_size=3))


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(default=PRICES, prices=st.lists(PRICES, min_size=1, max_size=3), jobs=st.lists(JOB, min_size=1, max_size=4),
       placement=st.lists(st.integers(0, 2), min_size=12, max_size=12))
def test_every_job_is_settled_what_its_servers_charged_whatever_the_prices(
        store, settings, default, prices, jobs, placement) -> None:
    """Servers at any prices (the global price anywhere among them), jobs of any size and max_cost, runs
    that complete, fail after one output, or lose their answer: each job is reserved at the dearest
    server's price, holds an unknown run whole at its server's price, is settled exactly what the servers
    charged it, and never overruns; the tenant is settled the servers' total."""
    store.redis.flushall()
    names = tuple(f"s{i}" for i in range(len(prices)))
    scripts: list[list[str]] = [[] for _ in names]
    providers = {name: Billed(price, scripts[i]) for i, (name, price) in enumerate(zip(names, prices, strict=True))}
    fleet = ",".join(f"{n}=http://127.0.0.1:9;price={p}" for n, p in zip(names, prices, strict=True))
    settings = dataclasses.replace(settings, price_per_output=default, retry_base_seconds=0.0, retry_cap_seconds=0.0,
                                   providers=fleet)
    executor = Executor(store, Fleet(settings.servers(), lambda s: providers[s.name]), BlobStore(settings.blob_dir),
                        settings)
    router = Router(store, settings, rng=lambda: 0.0)
    admit = admitter(store, settings)
    top, turn, admitted = max(prices), iter(placement), []
    for n, (outputs, max_cost, outcomes) in enumerate(jobs):
        body = {} if max_cost is None else {"max_cost": max_cost}
        if max_cost is not None and max_cost < outputs * top:
            with pytest.raises(InvalidRequest):
                submit(admit, f"k{n}", outputs, **body)
            continue
        job_id = submit(admit, f"k{n}", outputs, **body)
        job = store.job(job_id)
        assert (int(job["price"]), int(job["ceiling"])) == (top, min(outputs * top * 3, max_cost or outputs * top * 3))
        admitted.append(job_id)
        for outcome in [*outcomes, "complete", "complete", "complete"]:
            if store.job(job_id)["state"] != "queued":
                break
            server = names[next(turn, 0) % len(names)]
            only(store, server, names)
            scripts[names.index(server)][:] = [outcome]
            action = attempt(executor, router, job_id)
            if action == "reconcile":  # a whole run held, whatever was missing: the graph runs whole
                assert int(store.job(job_id)["uncertain"]) == outputs * providers[server].price_per_output
                assert reconcile(executor, router, job_id) == "reconciled"
            if store.job(job_id)["state"] == "retry_wait":
                store.promote(job_id)
        job = store.job(job_id)
        assert job["state"] in ("completed", "failed"), job["state"]
        paid = sum(p.charges.get(run["operation_id"], 0) for run in store.attempts(job_id)
                   for p in [providers[run["server"]]])
        assert (int(job["settled"]), job["reserved"], job["charged"], job["uncertain"]) == (paid, "0", "0", "0")
        assert int(job["settled"]) <= int(job["ceiling"])
    total = sum(units for p in providers.values() for units in p.charges.values())
    assert balanced(store) == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": total,
                               "available": ALLOWANCE - total}
    assert store.redis.hget(STATS, "charge_overruns_total") is None
    assert Counter(store.job(j)["state"] for j in admitted)["queued"] == 0
