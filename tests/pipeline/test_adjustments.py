"""Adjustments (lua/adjust.lua): a signed amount booked against a job under an id, once for good.

A property test runs the job state machine of test_state_machine.py with adjustments among its steps
(some repeated, some conflicting, some after the job was settled and packed) and whole runs whose
outcome is lost (charged or not, the hold resolved either way or left to settlement), and checks after
every step that the ledger balances, that the tenant's settled units are its jobs' settled plus their
adjustments, that a job at rest settled exactly its bookings (attempt charges and holds booked as
charged: fails when either is not recorded), and that every booking id was booked once.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from pipeline.errors import BookingRefused, InsufficientAllowance, JobNotFound
from pipeline.state import archive, booked, records
from pipeline.state.jobs import job_view
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import Code
from pipeline.state.status import audit
from pipeline.state.store import Store
from tests.pipeline.test_state_machine import TERMINAL, Jobs


def admit(store: Store, job_id: str, ceiling: int = 30, *, now_ms: int = 1_000_000) -> None:
    tenant = job_id.split(".")[0]
    record = {"id": job_id, "tenant": tenant, "state": "queued", "kind": "image", "priority": "batch",
              "outputs_requested": 1, "price": 10, "ceiling": ceiling, "reserved": ceiling, "charged": 0,
              "uncertain": 0, "settled": 0, "per_attempt": 10, "attempts_allowed": 3, "attempt_count": 0,
              "lease_gen": 0, "deadline_s": 10**9, "deadline": 10**13, "created_at": now_ms, "updated_at": now_ms,
              "idem_key": job_id}
    result = store.admit(tenant, job_id, job_id, fingerprint="f", ceiling=ceiling,
                         fields={k: str(v) for k, v in record.items()}, workflow=b"{}", status=202, now_ms=now_ms,
                         idem_ttl_s=60, outbox_delay_ms=0)
    if result.code is not Code.CREATED:
        raise InsufficientAllowance(0, ceiling)


def complete(store: Store, job_id: str, units: int = 10, *, now_ms: int = 1_000_100, server: str = "sim") -> None:
    claim = store.claim(job_id, worker="w", now_ms=now_ms, lease_ms=1000, operation_id="op-" + job_id,
                        servers={server: 1000})
    assert claim is not None
    store.mark_submit(claim, now_ms=now_ms + 1, epoch="e", lease_ms=1000)
    store.charge(claim, units)
    store.store_output(claim, 0, {"sha256": "a"}, now_ms=now_ms + 2)
    store.finish(claim, "completed", now_ms=now_ms + 3)


def balances(store: Store) -> dict[str, int]:
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    assert audit(store.redis, ["acme"]) == []
    return ledger


def test_an_adjustment_after_packing_is_booked_once_and_a_conflict_changes_nothing(store: Store, tenant) -> None:
    tenant("acme", 100)
    job = "acme." + "1" * 20
    admit(store, job)
    complete(store, job)
    assert archive.FIELD in store.redis.hgetall(JobKeys(job).record)  # packed
    assert balances(store)["settled"] == 10

    first = store.adjust(job, 7, "late-1", "late GPU charge", attempt=1, now_ms=2_000_000)
    assert (first.units, first.at, first.replayed) == (7, 2_000_000, False)
    again = store.adjust(job, 7, "late-1", "late GPU charge", attempt=1, now_ms=3_000_000)
    assert (again.units, again.at, again.replayed) == (7, 2_000_000, True)  # the first answer
    with pytest.raises(BookingRefused, match="already booked 7"):
        store.adjust(job, 8, "late-1", "late GPU charge", attempt=1)
    with pytest.raises(BookingRefused):
        store.adjust(job, 7, "late-1", "late GPU charge", attempt=0)
    assert balances(store) == {"allowance": 100, "reserved": 0, "uncertain": 0, "settled": 17, "available": 83}
    record = store.job(job)
    assert (record["settled"], record["adjusted"], record["state"]) == ("10", "7", "completed")

    cost = job_view(record, {})["cost"]
    assert cost["attempts"] == [{"attempt": 1, "server": "sim", "units": 10}]
    assert (cost["settled"], cost["adjusted"]) == (10, 7)
    assert cost["adjustments"] == [{"id": "late-1", "attempt": 1, "units": 7, "reason": "late GPU charge",
                                    "at": "1970-01-01T00:33:20.000Z"}]
    store.adjust(job, -12, "credit-1", "goodwill", now_ms=2_000_001)
    assert balances(store)["settled"] == 5
    with pytest.raises(BookingRefused, match="more than the 5"):
        store.adjust(job, -6, "credit-2", "too much")
    assert balances(store)["settled"] == 5
    assert store.redis.hlen(TenantKeys("acme").bookings) == 2
    assert [b["booking_id"] for b in store.bookings("acme", 0, 10**13)] == ["credit-1", "late-1"]


def test_an_adjustment_may_take_available_below_zero_and_admission_then_refuses(store: Store, tenant) -> None:
    tenant("acme", 40)
    job, other = "acme." + "1" * 20, "acme." + "2" * 20
    admit(store, job)
    complete(store, job)
    store.adjust(job, 35, "late-2", "late charge")
    assert balances(store)["available"] == -5
    with pytest.raises(InsufficientAllowance):
        admit(store, other, 10)
    assert balances(store)["available"] == -5
    store.adjust(job, -15, "credit-3", "correction")
    admit(store, other, 10)
    assert balances(store) == {"allowance": 40, "reserved": 10, "uncertain": 0, "settled": 30, "available": 0}


def test_an_unknown_job_or_attempt_or_a_bad_amount_books_nothing(store: Store, tenant) -> None:
    tenant("acme", 40)
    job = "acme." + "1" * 20
    with pytest.raises(JobNotFound, match="job"):
        store.adjust(job, 5, "x", "r")
    admit(store, job)
    with pytest.raises(JobNotFound, match="attempt"):
        store.adjust(job, 5, "x", "r", attempt=1)
    for units, booking_id in ((0, "x"), (5, ""), (5, "a\nb")):
        with pytest.raises(ValueError):
            store.adjust(job, units, booking_id, "r")
    assert store.redis.exists(TenantKeys("acme").bookings) == 0
    assert balances(store)["settled"] == 0


@pytest.mark.parametrize("charged", [False, True])
@pytest.mark.parametrize("executed", [None, True, False])
def test_a_lost_outcome_books_its_hold_once_and_the_bookings_add_up_to_the_settlement(
        store: Store, tenant, charged: bool, executed: bool | None) -> None:
    tenant("acme", 1000)
    job = "acme." + "1" * 20
    admit(store, job, 30)
    claim = store.claim(job, worker="w", now_ms=1_000_100, lease_ms=1000, operation_id="p1", servers={"gpu-a": 10})
    assert claim is not None
    store.mark_submit(claim, now_ms=1_000_101, epoch="e", lease_ms=1000)
    if charged:
        store.charge(claim, 10)
    store.begin_reconcile(job, now_ms=1_000_102, reason="u", claim=claim)
    rec = store.claim_reconcile(job, worker="r", now_ms=10**13, lease_ms=1000)
    assert rec is not None
    if executed is not None:
        store.resolve_uncertain(rec.claim, executed=executed)
        store.resolve_uncertain(rec.claim, executed=executed)  # again: nothing more to resolve
    store.finish(rec.claim, "failed", now_ms=10**13 + 1)
    record = store.job(job)
    if charged:  # the provider's report came first: nothing was held
        assert (booked.holds(record), record["settled"]) == ([], "10")
        assert booked.charges(record) == [{"attempt": 1, "server": "gpu-a", "units": 10}]
    else:
        hold = "released" if executed is False else "charged"
        assert booked.holds(record) == [{"attempt": 1, "server": "gpu-a", "outcome": hold,
                                         "units": 10 if hold == "charged" else 0, "held": 10}]
        assert (booked.charges(record), record["settled"]) == ([], "0" if executed is False else "10")
    assert balances(store)["settled"] == int(record["settled"])


class JobsWithAdjustments(Jobs):
    def __init__(self) -> None:
        super().__init__()
        self.booked: dict[str, tuple[str, int, int]] = {}  # id -> job, attempt, units

    @rule(data=st.data(), units=st.integers(-40, 40).filter(bool), repeat=st.booleans())
    def adjust(self, data: st.DataObject, units: int, repeat: bool) -> None:
        job_id = self.pick(data, *TERMINAL)
        if job_id is None:
            return
        if repeat and self.booked:
            booking_id = data.draw(st.sampled_from(sorted(self.booked)))
            job_id, attempt, booked_units = self.booked[booking_id]
            other = booked_units + (2 if booked_units == -1 else 1)  # another amount, never 0
            units = data.draw(st.sampled_from([booked_units, other]))
        else:
            booking_id, attempt = f"b{len(self.booked)}", 0
        job = self.store.job(job_id)
        total = sum(int(job.get(k, 0)) for k in ("settled", "charged", "adjusted"))
        try:
            done = self.store.adjust(job_id, units, booking_id, "r", attempt=attempt, now_ms=self.tick())
        except BookingRefused:
            assert booking_id in self.booked and self.booked[booking_id][2] != units or total + units < 0
            return
        assert done.replayed == (booking_id in self.booked)
        self.booked[booking_id] = (job_id, attempt, units)

    @rule(outputs=st.integers(1, 3), charged=st.booleans(), executed=st.sampled_from([None, True, False]),
          end=st.sampled_from(["failed", "cancelled"]))
    def run_with_an_unknown_outcome(self, outputs: int, charged: bool, executed: bool | None, end: str) -> None:
        """A whole run whose outcome is lost: charged or not first, its hold resolved (it ran, it never did) or
        left to settlement, and the job ended; so every kind of booking happens in every example."""
        before = set(self.model)
        self.admit(outputs)
        [job_id] = set(self.model) - before or [None]
        if job_id is None:
            return
        claim = self.store.claim(job_id, worker="w", now_ms=self.tick(), lease_ms=1000, operation_id="op",
                                 servers={"sim": 1000})
        assert claim is not None
        self.store.mark_submit(claim, now_ms=self.tick(), epoch="e", lease_ms=1000)
        if charged:
            self.store.charge(claim, outputs * 10)
        self.store.begin_reconcile(job_id, now_ms=self.tick(), reason="u", claim=claim)
        self.far += 10_000
        rec = self.store.claim_reconcile(job_id, worker="r", now_ms=self.far, lease_ms=1000)
        assert rec is not None
        if executed is not None:
            self.store.resolve_uncertain(rec.claim, executed=executed)
        self.store.finish(rec.claim, end, now_ms=self.far + 1)
        self.model[job_id].update(state=end, gen=rec.claim.generation)

    @rule(data=st.data(), units=st.integers(-40, 40).filter(bool), repeat=st.booleans())
    def adjust_again(self, data: st.DataObject, units: int, repeat: bool) -> None:
        """The same step once more, so that adjustments are as frequent as the job steps together."""
        self.adjust(data, units, repeat)

    @invariant()
    def ledger_balances_and_equals_the_sum_of_its_jobs(self) -> None:
        ledger = self.store.ledger("acme")
        assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
        assert min(ledger["reserved"], ledger["uncertain"], ledger["settled"]) >= 0
        jobs = [self.store.job(job_id) for job_id in self.model]
        assert ledger["reserved"] == sum(int(j["reserved"]) + int(j["charged"]) for j in jobs)
        assert ledger["uncertain"] == sum(int(j["uncertain"]) for j in jobs)
        assert ledger["settled"] == sum(int(j["settled"]) + int(j.get("adjusted", 0)) for j in jobs)
        assert sum(int(j.get("adjusted", 0)) for j in jobs) == sum(units for _, _, units in self.booked.values())

    @invariant()
    def a_settled_jobs_bookings_add_up_to_what_it_settled(self) -> None:
        """The usage records reconcile to the ledger: a job at rest in an end state settled exactly its
        attempts' charges and the holds booked as charged (one booking per attempt and kind)."""
        for job_id in self.model:
            job = self.store.job(job_id)
            if job["state"] in TERMINAL:
                rows = booked.charges(job) + [h for h in booked.holds(job) if h["outcome"] == "charged"]
                assert int(job["settled"]) == sum(r["units"] for r in rows), (job_id, job)

    @invariant()
    def the_usage_records_add_up_to_the_tenants_settled(self) -> None:
        """One row per booking, each once, summing to the ledger's settled: a replayed run's rows stay."""
        rows = list(records.every(self.store.redis, "acme", start_ms=0, end_ms=2**52))
        assert len({r["booking_id"] for r in rows}) == len(rows)
        assert sum(r["units"] for r in rows) == self.store.ledger("acme")["settled"]

    @invariant()
    def every_id_is_booked_once(self) -> None:
        stored = self.store.redis.hgetall(TenantKeys("acme").bookings)
        logged = {i for i, raw in stored.items() if "kind" in orjson.loads(raw)}  # a replayed run's (replay.lua)
        assert all(i.startswith(("charge:", "uncertain:")) for i in logged)
        assert sorted(set(stored) - logged) == sorted(self.booked)
        assert self.store.redis.zcard(TenantKeys("acme").booking_log) == len(stored)


def test_adjustments_interleaved_with_every_step_keep_the_ledger_and_book_each_id_once(redis_server: str) -> None:
    JobsWithAdjustments.redis_url = redis_server
    run_state_machine_as_test(JobsWithAdjustments, settings=hsettings(
        max_examples=40, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))
