"""The runbook's commands for a provider's statement that does not reconcile (ops/RUNBOOK.md "A statement
that does not reconcile"), run by tests/faults/test_runbook.py against its live stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pipeline.state import archive, booked
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.store import Store


def billed(store: Store, tenant: str) -> dict[str, tuple[str, int, int]]:
    """Operation id -> (job, attempt, units) of every attempt the tenant's finished jobs were booked for:
    each job's own attempts (their operation ids) and what its record says each attempt was charged, or its
    hold booked as charged."""
    found: dict[str, tuple[str, int, int]] = {}
    for job_id in store.redis.zrange(TenantKeys(tenant).done, 0, -1):
        j = JobKeys(job_id)
        record = store.job(job_id) or {}
        runs = archive.attempts(store.redis.hgetall(j.attempts), store.redis.hget(j.record, archive.FIELD))
        ops = {run["number"]: run["operation_id"] for run in runs if run.get("operation_id")}
        for entry in [*booked.charges(record), *booked.holds(record)]:
            op = ops[entry["attempt"]]
            found[op] = (job_id, entry["attempt"], found.get(op, (job_id, 0, 0))[2] + entry["units"])
    return found


def statement(rb: Any, store: Store, tenant: str, folder: Path) -> None:
    """The stack's own attempts billed by a statement that agrees but for one line (3 units more):
    reconcile finds that one difference (exit 1), ``--apply`` books it once, a second reconcile exits 0;
    the export lists the correction first; a cost adjustment agreed with the provider books once.
    ``rb``: the test's runbook runner."""
    books = billed(store, tenant)
    assert len(books) >= 8, books  # every completed job and the reviewed ones
    dearer, (job_id, attempt, units) = next((op, b) for op, b in sorted(books.items()) if b[2] > 0)
    path = folder / "statement.csv"
    path.write_text("date,operation_id,units,sku\n" + "".join(
        f"2026-11-30,{op},{n + 3 * (op == dearer)},gpu-seconds\n" for op, (_, _, n) in sorted(books.items())))
    before = store.ledger(tenant)
    differ = {"operation_id": dearer, "job": job_id, "attempt": attempt, "server": "comfyui", "booked": units,
              "statement": units + 3}
    report = orjson.loads(rb.run("reckon invoice reconcile FILE", code=1, FILE=path))
    assert report == {"lines": len(books), "unknown": [], "missing": [], "differ": [differ], "duplicate": [],
                      "booked": [], "refused": []}
    assert store.ledger(tenant) == before  # nothing booked without --apply
    correction = {"booking_id": f"statement:{dearer}:{units + 3}", "job": job_id, "attempt": attempt, "units": 3}
    applied = orjson.loads(rb.run("reckon invoice reconcile FILE --apply", code=1, FILE=path))
    assert (applied["differ"], applied["booked"]) == ([differ], [{**correction, "replayed": False}])
    settled = before["settled"] + 3
    assert store.ledger(tenant) == {**before, "settled": settled, "available": before["available"] - 3}
    again = orjson.loads(rb.run("reckon invoice reconcile FILE", FILE=path))  # exit 0
    assert (again["differ"], again["booked"], again["lines"]) == ([], [], len(books))
    rows = [orjson.loads(line) for line in rb.lines("reckon usage export TENANT --format jsonl", TENANT=tenant)]
    assert {k: rows[0][k] for k in ("kind", "booking_id", "job", "attempt", "operation_id", "units")} == {
        "kind": "adjustment", **correction, "operation_id": dearer}
    assert sum(row["units"] for row in rows) == settled  # every booking of the tenant, once
    agreed = {"booking_id": "dispute-2026-11-1", "job": job_id, "attempt": None, "units": -1}
    for replayed in (False, True):  # the same id twice books once
        done = rb.json("reckon cost adjust JOB_ID --units N --id ID --reason 'agreed with the provider'",
                       JOB_ID=job_id, N=-1, ID=agreed["booking_id"])
        assert {k: done[k] for k in (*agreed, "replayed")} == {**agreed, "replayed": replayed}
    assert store.ledger(tenant) == {**before, "settled": settled - 1, "available": before["available"] - 2}
