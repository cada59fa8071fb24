"""Usage records of a job whose lost outcome was resolved, then replayed (issue 32 review).

A job's charges and resolved holds are timed at its score in the tenant's done index
(pipeline/state/records.py); a dead-letter replay (lua/replay.lua) takes the job out of that index and
the job's next end enters it again at a new time. What the first run settled stays settled in the
ledger at the first end, so the records of a window holding the first end must still list it: the
replay logs them in the tenant's booking log at that time. Before, they left the window (records
([], 0) while the job ran again), and the month after listed them, so a statement of that month
reported the first run's prompt 'missing' and reconcile --apply booked it back as a credit.
"""

from __future__ import annotations

import pytest

from pipeline.operate import invoice
from pipeline.state import records
from pipeline.state.store import Store
from tests.pipeline.test_adjustments import admit, balances, complete

JOB = "acme." + "1" * 20
FIRST_END, REPLAYED, SECOND_END = 2_000_001, 3_000_000, 3_000_103


def lost_then_failed_by_the_operator(store: Store) -> None:
    """Attempt 1 (operation p1 on gpu-a) loses its outcome; its hold of 10 is booked as charged and the job
    fails at FIRST_END (settled 10), as `reckon review resolve --failed` leaves it."""
    admit(store, JOB, 30)
    claim = store.claim(JOB, worker="w", now_ms=1_000_100, lease_ms=1000, operation_id="p1", servers={"gpu-a": 10})
    assert claim is not None
    store.mark_submit(claim, now_ms=1_000_101, epoch="e", lease_ms=1000)
    store.begin_reconcile(JOB, now_ms=1_000_102, reason="u", claim=claim)
    rec = store.claim_reconcile(JOB, worker="r", now_ms=2_000_000, lease_ms=1000)
    assert rec is not None
    store.resolve_uncertain(rec.claim, executed=True)
    store.finish(rec.claim, "failed", now_ms=FIRST_END)


def total(store: Store, start_ms: int, end_ms: int) -> tuple[list[str], int]:
    rows = list(records.every(store.redis, "acme", start_ms=start_ms, end_ms=end_ms))
    return [r["booking_id"] for r in rows], sum(r["units"] for r in rows)


def test_a_replayed_jobs_first_run_stays_in_the_window_it_settled_in(store: Store, tenant) -> None:
    tenant("acme", 1000)
    lost_then_failed_by_the_operator(store)
    assert balances(store)["settled"] == 10
    november = (0, 2_500_000)
    assert total(store, *november) == ([f"uncertain:{JOB}:1"], 10)  # the ledger's change in the window

    store.replay(JOB, now_ms=REPLAYED)
    assert balances(store)["settled"] == 10  # a replay settles nothing back
    assert total(store, *november) == ([f"uncertain:{JOB}:1"], 10)  # fails: ([], 0) while it runs again

    complete(store, JOB, 10, now_ms=3_000_100, server="gpu-b")
    assert balances(store)["settled"] == 20
    assert total(store, *november) == ([f"uncertain:{JOB}:1"], 10)
    assert total(store, 2_500_001, 4_000_000) == ([f"charge:{JOB}:2"], 10)
    [row] = records.every(store.redis, "acme", start_ms=0, end_ms=2_500_000)
    assert row == {"at": FIRST_END, "kind": "uncertain", "booking_id": f"uncertain:{JOB}:1", "job": JOB, "attempt": 1,
                   "server": "gpu-a", "operation_id": "p1", "seconds": None, "units": 10, "reason": "charged"}
    assert store.bookings("acme", 0, 10**13) == []  # the adjustments alone


def test_reconciling_the_month_after_a_replay_finds_no_attempt_of_the_month_before(store: Store, tenant) -> None:
    tenant("acme", 1000)
    lost_then_failed_by_the_operator(store)
    store.replay(JOB, now_ms=REPLAYED)
    complete(store, JOB, 10, now_ms=3_000_100, server="gpu-b")
    december = invoice.books(store.redis, start_ms=2_500_001, end_ms=4_000_000, server=None)
    report = invoice.compare({f"op-{JOB}": 10}, {}, december)  # December's statement bills attempt 2 only
    assert report.missing == []  # fails: p1 (November's, billed then) is 'missing', and --apply books -10
    assert sorted(december) == [f"op-{JOB}"]
    november = invoice.books(store.redis, start_ms=0, end_ms=2_500_000, server=None)
    assert invoice.compare({"p1": 10}, {}, november).clean()
