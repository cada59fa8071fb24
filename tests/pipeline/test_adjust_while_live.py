"""Adjustments booked while the job is still live (issue 32 review): before its charge, during an
uncertain hold, and the charge and the hold's resolution booked after.

A credit is bounded by what the job was booked for good: a hold may still go back to the reservation
(the run provably never happened), so a credit counted against it could leave the job's total below
zero and the tenant's settled below what its jobs cost.
"""

from __future__ import annotations

import pytest

from pipeline.errors import BookingRefused
from pipeline.state import booked, records
from pipeline.state.store import Store
from tests.pipeline.test_adjustments import admit, balances

JOB = "acme." + "1" * 20


def held(store: Store):
    """Attempt 1 submitted, its outcome lost: 10 units held uncertain; the reconciler's claim."""
    admit(store, JOB, 30)
    claim = store.claim(JOB, worker="w", now_ms=1_000_100, lease_ms=1000, operation_id="p1", servers={"gpu-a": 10})
    assert claim is not None
    store.mark_submit(claim, now_ms=1_000_101, epoch="e", lease_ms=1000)
    store.begin_reconcile(JOB, now_ms=1_000_102, reason="u", claim=claim)
    assert balances(store)["uncertain"] == 10
    rec = store.claim_reconcile(JOB, worker="r", now_ms=2_000_000, lease_ms=1000)
    assert rec is not None
    return rec


def test_a_credit_during_a_hold_is_refused_so_a_released_hold_leaves_no_credit_behind(store: Store, tenant) -> None:
    tenant("acme", 100)
    rec = held(store)
    with pytest.raises(BookingRefused, match="more than the 0"):
        store.adjust(JOB, -10, "credit-1", "goodwill", now_ms=2_000_001)
    store.resolve_uncertain(rec.claim, executed=False)  # it never ran: the hold goes back
    store.finish(rec.claim, "failed", now_ms=2_000_002)
    ledger = balances(store)
    assert (ledger["settled"], ledger["available"]) == (0, 100)
    assert store.job(JOB).get("adjusted", "0") == "0"


def test_a_charge_booked_during_a_hold_and_its_resolution_after_add_up(store: Store, tenant) -> None:
    tenant("acme", 100)
    rec = held(store)
    store.adjust(JOB, 4, "late-1", "late charge", attempt=1, now_ms=2_000_001)
    store.resolve_uncertain(rec.claim, executed=True)  # it ran: the hold is booked as charged
    store.adjust(JOB, -14, "credit-2", "refund all", now_ms=2_000_002)  # 10 charged + 4 adjusted: all of it
    store.finish(rec.claim, "failed", now_ms=2_000_003)
    ledger = balances(store)
    assert (ledger["settled"], ledger["available"]) == (0, 100)
    rows = list(records.every(store.redis, "acme", start_ms=0, end_ms=10**13))
    assert [(r["booking_id"], r["units"]) for r in rows] == [
        (f"uncertain:{JOB}:1", 10), ("credit-2", -14), ("late-1", 4)]


def test_an_amount_past_14_digits_is_booked_exactly_and_its_id_replays(store: Store, tenant) -> None:
    """cjson writes numbers with 14 significant digits: 1234567890123456 was stored as 1.2345678901235e+15,
    so the same id again was refused ('already booked 1234567890123500') and the rows said 44 units more
    than the ledger."""
    tenant("acme", 100)
    admit(store, JOB, 30)
    for units, booking_id in ((2**53 - 1, "most"), (-(2**53 - 1), "bigger-credit"), (1_234_567_890_123_456, "big")):
        first = store.adjust(JOB, units, booking_id, "r", now_ms=2_000_000)
        again = store.adjust(JOB, units, booking_id, "r", now_ms=2_000_001)
        assert (first.units, again.units, again.replayed) == (units, units, True)
    total = 1_234_567_890_123_456
    assert balances(store)["settled"] == total
    assert sum(a["units"] for a in booked.adjustments(store.job(JOB))) == total
    assert [b["units"] for b in store.bookings("acme", 0, 10**13)] == [2**53 - 1, -(2**53 - 1), 1_234_567_890_123_456]
    rows = list(records.every(store.redis, "acme", start_ms=0, end_ms=10**13))
    assert sum(r["units"] for r in rows) == total
