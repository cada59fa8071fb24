"""What a kept slot's prompt costs: a review that leaves a prompt running at its server (reason
`reconcile_timed_out`, its slot kept: lua/_slots.lua ``keep_slot``) holds a whole run as uncertain; the
watcher's word that the prompt completed books that run as charged, once, in the call that gives the slot
back (lua/slot-let-go.lua), so no later decision books the tenant below what the provider billed
(docs/costs.md "A prompt a review leaves at its server"). Real scripts, real redis-server, one shard and
two; the kept-slot deployment of tests/pipeline/test_kept_slots.py."""

from __future__ import annotations

from pipeline.state import keys
from tests.pipeline.test_kept_slots import Deployment, deployed  # noqa: F401  (the fixture)

ALLOWANCE = 10**6  # acme's (Deployment.admit)
HELD = 30  # a job's reservation: 1 output at the settings' highest price; a run at `sim` costs 10


def ledger_totals(d: Deployment) -> dict[str, int]:
    """The ledger totals of every tenant (the global stats' `ledger:<field>`), summed over the shards."""
    return {field: sum(int(d.store.redis.hget(shard.stats, f"ledger:{field}") or 0) for shard in keys.shards())
            for field in ("reserved", "uncertain", "settled")}


def run_again(d: Deployment, job_id: str) -> None:
    """The operator's retry runs at `sim` and completes: the provider bills its whole run (10)."""
    again = d.claim(job_id, "op-2")
    assert again is not None and again.server == "sim"
    d.store.mark_submit(again, epoch="e1", lease_ms=30_000)
    d.store.charge(again, 10)
    d.store.store_output(again, 0, {"sha256": "ab" * 32, "bytes": 1, "content_type": "image/png"})
    d.store.finish(again, "completed")


def test_a_retry_after_the_kept_prompt_completed_books_both_runs_the_provider_billed(
        deployed: Deployment) -> None:  # noqa: F811
    """The kept prompt completes at the server (billed 10), the operator retries, the retry runs (billed
    10): the tenant is settled 20, what the provider billed. On 56716bc the give-back booked nothing and
    the retry returned the hold: settled 10."""
    d = deployed
    job_id, slot = d.reviewed()
    assert d.store.ledger("acme") == {"allowance": ALLOWANCE, "reserved": HELD - 10, "uncertain": 10, "settled": 0,
                                      "available": ALLOWANCE - HELD}
    d.server.state = "completed"
    d.watch().tick()
    job = d.store.job(job_id)
    assert (d.kept(), job["state"], job["uncertain"], job["charged"]) == ([], "needs_review", "0", "10")
    assert (d.store.ledger("acme")["reserved"], d.store.ledger("acme")["uncertain"]) == (HELD, 0)  # 10 charged
    assert d.store.resolve_review(job_id, "retry", reason="operator_retry") == "queued"
    run_again(d, job_id)
    billed = 20
    assert d.store.ledger("acme") == {"allowance": ALLOWANCE, "reserved": 0, "uncertain": 0, "settled": billed,
                                      "available": ALLOWANCE - billed}
    assert ledger_totals(d) == {"reserved": 0, "uncertain": 0, "settled": billed}


def test_the_completed_prompt_is_booked_once_and_never_after_the_review_ended(
        deployed: Deployment) -> None:  # noqa: F811
    """Two watchers (a standby that took over) hear the same completion: charged 10 once. A review the
    operator already resolved `--failed` (its hold settled as charged, 10) gains nothing when the watcher
    hears afterwards; a prompt the server says failed leaves the hold uncertain for the operator."""
    d = deployed
    first, slot = d.reviewed()
    assert d.store.slots.let_go(slot, "sim", completed=True) is True
    assert d.store.slots.let_go(slot, "sim", completed=True) is False
    assert (d.store.job(first)["charged"], d.store.job(first)["uncertain"]) == ("10", "0")
    second, second_slot = d.reviewed(key="b")
    assert d.store.resolve_review(second, "failed", reason="operator_failed") == "failed"
    assert d.store.slots.let_go(second_slot, "sim", completed=True) is True
    assert d.store.job(second)["settled"] == "10"
    third, third_slot = d.reviewed(key="c")
    d.server.state = "failed"
    d.watch().tick()
    assert (d.kept(), d.store.job(third)["uncertain"], d.store.job(third).get("charged", "0")) == ([], "10", "0")
    reserved = HELD + (HELD - 10)  # the first's reservation (10 of it charged), the third's left
    assert d.store.ledger("acme") == {"allowance": ALLOWANCE, "reserved": reserved, "uncertain": 10, "settled": 10,
                                      "available": ALLOWANCE - reserved - 20}
    assert ledger_totals(d) == {"reserved": reserved, "uncertain": 10, "settled": 10}
