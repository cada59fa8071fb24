"""The usage records of uncertain holds (issue 32 review): every way a hold resolves gives one row, its
amount as documented, the rows add up to the tenant's settled, the CSV and JSONL exports say the same,
and pages read while other holds resolve and their jobs end never repeat or skip a row.
"""

from __future__ import annotations

import csv
import io
import random

import orjson

from pipeline.operate import cli
from pipeline.state import records
from pipeline.state.store import Store
from tests.pipeline.test_adjustments import admit, balances, complete

T0 = 1_796_000_000_000


def lost(store: Store, job: str, at: int, how: str) -> None:
    """Job ``job``'s attempt 1 loses its outcome (10 held), then: ``charge`` (the provider's report, 8),
    ``ran`` / ``never`` (reconciliation learns it), ``review`` (an operator fails it: booked as charged),
    or ``settle`` (left to settlement); the job ends at ``at``."""
    admit(store, job, 30, now_ms=T0 - 100_000)
    claim = store.claim(job, worker="w", now_ms=at - 50, lease_ms=1000, operation_id="op-" + job, servers={"g": 10})
    assert claim is not None
    store.mark_submit(claim, now_ms=at - 49, epoch="e", lease_ms=1000)
    store.begin_reconcile(job, now_ms=at - 48, reason="u", claim=claim)
    rec = store.claim_reconcile(job, worker="r", now_ms=at - 10, lease_ms=1000)
    assert rec is not None
    if how == "charge":
        store.charge(rec.claim, 8)
    elif how in ("ran", "never"):
        store.resolve_uncertain(rec.claim, executed=how == "ran")
    if how == "review":
        store.send_to_review(rec.claim, expires_in_ms=10**9, reason="outcome_unknowable", now_ms=at - 5)
        store.resolve_review(job, "failed", reason="operator", now_ms=at)
    else:
        store.finish(rec.claim, "failed", now_ms=at)


EXPECTED = {"charge": [("charge", 8, None), ("uncertain", 0, "released")], "ran": [("uncertain", 10, "charged")],
            "never": [("uncertain", 0, "released")], "review": [("uncertain", 10, "charged")],
            "settle": [("uncertain", 10, "charged")]}


def test_each_way_a_hold_resolves_gives_one_row_and_the_exports_agree(store: Store, tenant, capsys) -> None:
    tenant("acme", 10_000)
    jobs = {}
    for i, how in enumerate(EXPECTED):
        jobs[how] = job = f"acme.{i + 1:020x}"
        lost(store, job, T0 + 1000 * i, how)
    store.adjust(jobs["review"], -3, 'credit, "quoted"', 'a reason, with "quotes"', attempt=1, now_ms=T0 + 3500)
    rows = list(records.every(store.redis, "acme", start_ms=0, end_ms=T0 + 10_000))
    for how, job in jobs.items():
        mine = sorted((r["kind"], r["units"], r["reason"]) for r in rows if r["job"] == job and r["kind"] != "adjustment")
        assert mine == sorted(EXPECTED[how]), how
        assert all(r["booking_id"] == f"{r['kind']}:{job}:1" and r["attempt"] == 1 and r["server"] == "g"
                   and r["operation_id"] == f"op-{job}" for r in rows if r["job"] == job and r["kind"] != "adjustment")
    assert len({r["booking_id"] for r in rows}) == len(rows) == 7
    assert sum(r["units"] for r in rows) == balances(store)["settled"] == 8 + 10 + 10 + 10 - 3

    window = ["--from", "2026-11-30T00:00:00Z", "--to", "2026-12-01T00:00:00Z"]
    assert cli.main(["usage", "export", "acme", *window, "--format", "jsonl"], store=store) == 0
    jsonl = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli.main(["usage", "export", "acme", *window, "--format", "csv"], store=store) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["booking_id"] for r in jsonl] == [r["booking_id"] for r in rows]
    assert [{k: "" if v is None else str(v) for k, v in r.items()} for r in jsonl] == table


def test_pages_read_while_holds_resolve_never_repeat_or_skip_a_row(store: Store, tenant) -> None:
    tenant("acme", 10**6)
    rng = random.Random(32)
    ways = list(EXPECTED)
    for i in range(24):  # ends at few distinct times: many ties across the two indexes
        lost(store, f"acme.{i + 1:020x}", T0 + 1000 * rng.randrange(6), rng.choice(ways))
    for i in range(6):
        store.adjust(f"acme.{rng.randrange(24) + 1:020x}", 1 + i, f"adj-{i}", "r", now_ms=T0 + 1000 * rng.randrange(6))
    end = T0 + 100_000
    everything = [(r["at"], r["booking_id"]) for r in records.every(store.redis, "acme", start_ms=0, end_ms=end)]
    assert everything == sorted(everything, reverse=True) and len(set(everything)) == len(everything)
    for limit in (1, 2, 3, 5):
        seen, cursor, later = [], None, 100 + limit * 100
        while True:
            rows, cursor = records.page(store.redis, "acme", start_ms=0, end_ms=end, cursor=cursor, limit=limit)
            seen += [(r["at"], r["booking_id"]) for r in rows]
            if cursor is None:
                break
            later += 1  # meanwhile another hold resolves and its job ends, newer than any page read
            lost(store, f"acme.{later:020x}", T0 + 10_000 + later, rng.choice(ways))
        assert seen == everything, limit
        everything = [(r["at"], r["booking_id"]) for r in records.every(store.redis, "acme", start_ms=0, end_ms=end)]
