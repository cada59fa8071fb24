"""How long an adjustment's id is kept (docs/costs.md "Adjustments"): booked once for as long as its
job is kept, packed or not; gone with the job when it is purged past its retention (lua/purge.lua), so
the tenant's bookings do not grow without bound."""

from __future__ import annotations

import pytest

from pipeline.errors import JobNotFound
from pipeline.state import archive, records
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.store import Store
from tests.pipeline.test_adjustments import admit, balances, complete

RETENTION_MS = 60_000


def test_an_id_books_once_while_its_job_is_kept_and_goes_with_it_at_retention(store: Store, tenant) -> None:
    tenant("acme", 100)
    t = TenantKeys("acme")
    job, other = "acme." + "1" * 20, "acme." + "2" * 20
    admit(store, job)
    admit(store, other)
    assert not store.adjust(job, 4, "early-1", "set-up fee", now_ms=1_000_050).replayed  # booked while queued
    complete(store, job)
    complete(store, other, now_ms=1_000_200)
    assert archive.FIELD in store.redis.hgetall(JobKeys(job).record)  # packed, its adjustments with it
    store.adjust(job, 3, "statement-2026-11:op-1", "late GPU seconds", attempt=1, now_ms=2_000_000)
    store.adjust(other, 5, "keep-2", "late GPU seconds", attempt=1, now_ms=2_000_001)
    booked = balances(store)
    assert booked == {"allowance": 100, "reserved": 0, "uncertain": 0, "settled": 32, "available": 68}

    for booking_id, units, attempt in (("early-1", 4, 0), ("statement-2026-11:op-1", 3, 1)):  # after packing
        assert store.adjust(job, units, booking_id, "again", attempt=attempt, now_ms=3_000_000).replayed
    assert balances(store) == booked
    settled_at = int(store.job(job)["settled_at"])
    assert store.purge(job, retention_ms=RETENTION_MS, now_ms=settled_at + RETENTION_MS - 1) is False  # kept
    assert sorted(store.redis.hkeys(t.bookings)) == ["early-1", "keep-2", "statement-2026-11:op-1"]

    assert store.purge(job, retention_ms=RETENTION_MS, now_ms=settled_at + RETENTION_MS) is True
    assert store.redis.hkeys(t.bookings) == ["keep-2"]  # the other job's id is kept with its job
    assert store.redis.zrange(t.booking_log, 0, -1) == ["keep-2"]
    assert [r["booking_id"] for r in records.every(store.redis, "acme", start_ms=0, end_ms=2**53)
            if r["kind"] == "adjustment"] == ["keep-2"]
    assert balances(store) == booked  # what was booked stays booked: only the ids went
    with pytest.raises(JobNotFound):  # nothing to book it against: the id cannot book twice
        store.adjust(job, 3, "statement-2026-11:op-1", "late GPU seconds", attempt=1)
    assert balances(store) == booked

    assert store.purge(other, retention_ms=RETENTION_MS, now_ms=settled_at + 10 * RETENTION_MS) is True
    assert store.redis.exists(t.bookings, t.booking_log) == 0  # every byte they held is freed
    assert store.redis.memory_usage(t.bookings) is None
