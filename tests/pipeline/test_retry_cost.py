"""A retry is afforded at what the provider bills for it: ComfyUI runs the whole graph for every
prompt, so a retry asking only for the outputs a partial run left missing is billed every output of
the job (the simulated server started with graph_outputs=N does the same and keeps the ground-truth
charge ledger). The router lets a retry go only when the job's remaining reservation holds that
whole run at the dearest price it may run at (docs/costs.md, "What a retry is afforded at")."""

from __future__ import annotations

import dataclasses

from pipeline.errors import AttemptFailed
from pipeline.providers import sim as simulated
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor
from pipeline.work.routing import Router
from tests.pipeline.test_failures import inject, units
from tests.pipeline.test_prices import WORKFLOW, balanced

STATS = keys.ShardKeys(0).stats


def attempt(executor: Executor, router: Router, job_id: str) -> str:
    try:
        return "done" if executor.run(job_id) else "skipped"
    except AttemptFailed as failed:
        return router.route(failed)


def admit(store: Store, settings: Settings, allowance: int, **body: object) -> str:
    """A job of three outputs for tenant acme, created with ``allowance``, admitted on ``settings``' fleet."""
    create_tenant(store.redis, "acme", allowance)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    return admitter.submit("acme", "k1", {"kind": "image", "workflow": WORKFLOW, "outputs": 3, **body}).job_id


def asked(server: simulated.SimServer) -> list[list[int]]:
    """The output indices each prompt the server ran asked for (``extra_data.reckon_outputs``), in order."""
    with server.sim.cond:
        prompts = [server.sim.history[c["prompt_id"]]["prompt"] for c in server.sim.charges]
    return [prompt[3]["reckon_outputs"] for prompt in prompts]


def test_a_retry_for_the_missing_outputs_is_held_and_settled_as_the_whole_run_it_is_billed(
        store, settings, make_executor, make_router) -> None:
    """Three outputs at 10 (ceiling 90): the first run stores output 0 and fails (billed 10). The retry
    is afforded at the whole run (30 of the 80 left), asks for outputs 1 and 2 only (0 is kept, not
    fetched again) and is billed all three (30): the job completes with its three outputs, is settled
    40, what the server's charge ledger says, with no overrun; the ledger balances after every step."""
    server = simulated.start(graph_outputs=3)
    try:
        job_id = admit(store, settings, 10_000)
        executor, router = make_executor(server), make_router(retry_base_seconds=0.0)
        assert balanced(store) == {"allowance": 10_000, "reserved": 90, "uncertain": 0, "settled": 0,
                                   "available": 9_910}
        inject(server, {"kind": "partial", "produce": 1})
        assert attempt(executor, router, job_id) == "retry"
        first = store.outputs(job_id)
        assert (sorted(first), units(server)) == ([0], [10])
        job = store.job(job_id)
        assert (job["state"], job["reserved"], job["charged"], job["error_class"]) == (
            "retry_wait", "80", "10", "provider_failed")
        assert int(job["reserved"]) >= 3 * 10  # the retry's whole run is held
        assert balanced(store) == {"allowance": 10_000, "reserved": 90, "uncertain": 0, "settled": 0,
                                   "available": 9_910}
        store.promote(job_id)
        assert attempt(executor, router, job_id) == "done"
    finally:
        server.close()
    assert (units(server), asked(server)) == ([10, 30], [[0, 1, 2], [1, 2]])
    job = store.job(job_id)
    assert (job["state"], job["reserved"], job["charged"], job["uncertain"], job["settled"]) == (
        "completed", "0", "0", "0", "40")
    assert "overrun" not in job and store.redis.hget(STATS, "charge_overruns_total") is None
    outputs = store.outputs(job_id)
    assert sorted(outputs) == [0, 1, 2] and outputs[0] == first[0]
    assert int(job["settled"]) == sum(units(server))
    assert balanced(store) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 40,
                               "available": 9_960}


def test_a_retry_the_reservation_holds_for_the_missing_outputs_but_not_the_whole_run_is_not_made(
        store, settings, make_executor, make_router) -> None:
    """A tenant of 60 units admits three outputs at 10 with max_cost 60 (two attempts, its whole
    allowance reserved). Server b, at 20, joined since: a retry may run there and be billed 3 x 20 = 60.
    The first run, on a at 10, stores output 0 and fails (billed 10), leaving 50: that pays for the two
    missing outputs at 20 (40), not for the whole run b would bill (60). The job is not retried: it fails
    `reservation_exhausted` (the cause, `provider_failed`, its reason), keeps output 0, is settled the
    10 a billed (b billed nothing), and the tenant's 50 are released. On d89904b it was retried (40 <= 50),
    and a run on b would have been booked 60 against the 50 held: an overrun past the tenant's allowance."""
    a, b = simulated.start(graph_outputs=3, price_per_output=10), simulated.start(graph_outputs=3,
                                                                                  price_per_output=20)
    try:
        job_id = admit(store, dataclasses.replace(settings, providers=f"sim={a.url};price=10"), 60, max_cost=60)
        job = store.job(job_id)
        assert (job["price"], job["ceiling"], job["attempts_allowed"]) == ("10", "60", "2")
        assert balanced(store) == {"allowance": 60, "reserved": 60, "uncertain": 0, "settled": 0, "available": 0}
        executor = make_executor(a)  # the claim takes server "sim", served by a
        router = make_router(retry_base_seconds=0.0, providers=f"sim={a.url};price=10,b={b.url};price=20")
        inject(a, {"kind": "partial", "produce": 1})
        assert attempt(executor, router, job_id) == "dead_letter"
    finally:
        a.close()
        b.close()
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["error_reason"], job["attempt_count"]) == (
        "failed", "reservation_exhausted", "provider_failed", "1")
    assert (job["reserved"], job["charged"], job["uncertain"], job["settled"]) == ("0", "0", "0", "10")
    assert sorted(store.outputs(job_id)) == [0]
    assert (units(a), units(b)) == ([10], [])
    assert balanced(store) == {"allowance": 60, "reserved": 0, "uncertain": 0, "settled": 10, "available": 50}
