"""A stateful property test: random sequences of every state-changing script, against a model.

After each step: the job is in the state the model predicts (so no illegal transition was
accepted), every recorded transition is a legal one, the tenant ledger balances
(allowance = available + reserved + uncertain + settled) and equals the sum of its jobs,
and no job was settled more often than it was started (admitted or replayed); the global
figures (counts per class and state, ledger totals, queue and due indexes) equal the sum of the jobs.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from pipeline.claims import Claim
from pipeline.errors import CancelRequested, IncompleteOutputs, InsufficientAllowance, NotAllowed, StaleLease
from pipeline.state.redisconn import connect_url
from pipeline.state.scripts import Code
from pipeline.state.status import audit
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant

PRICE, ALLOWANCE, FAR = 10, 300, 10**13
TERMINAL = {"completed", "failed", "cancelled"}
LEGAL = {
    (None, "queued"), ("queued", "running"), ("queued", "retry_wait"), ("queued", "cancelled"),
    ("running", "completed"), ("running", "failed"), ("running", "cancelled"), ("running", "retry_wait"),
    ("running", "reconciling"), ("retry_wait", "queued"), ("retry_wait", "failed"), ("retry_wait", "cancelled"),
    ("reconciling", "completed"), ("reconciling", "failed"), ("reconciling", "cancelled"),
    ("reconciling", "retry_wait"), ("reconciling", "needs_review"), ("needs_review", "queued"),
    ("needs_review", "failed"), ("needs_review", "completed"), ("needs_review", "cancelled"), ("failed", "queued"),
    ("running", "running"), ("reconciling", "reconciling"),  # cancel requested: an event, no move
}


class Jobs(RuleBasedStateMachine):
    claims = Bundle("claims")
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.store = Store(connect_url(self.redis_url))
        self.store.redis.flushall()
        create_tenant(self.store.redis, "acme", ALLOWANCE)
        self.model: dict[str, dict] = {}
        self.ids = itertools.count(1)
        self.now = 1_000_000
        self.far = FAR

    def tick(self) -> int:
        self.now += 1
        return self.now

    def holds(self, claim: Claim) -> bool:
        job = self.model[claim.job_id]
        return job["state"] in ("running", "reconciling") and job["gen"] == claim.generation

    def fenced(self, claim: Claim, write) -> bool:
        """Run a fenced write; it must succeed exactly when the model says the lease is held."""
        if self.holds(claim):
            write()
            return True
        with pytest.raises(StaleLease):
            write()
        return False

    @rule(outputs=st.integers(1, 3))
    def admit(self, outputs: int) -> None:
        if len(self.model) >= 8:
            return
        job_id = f"acme.{next(self.ids):020x}"
        ceiling = outputs * PRICE * 3
        record = {"id": job_id, "tenant": "acme", "state": "queued", "kind": "image", "priority": "batch",
                  "workflow": "{}", "outputs_requested": outputs, "price": PRICE, "ceiling": ceiling,
                  "reserved": ceiling, "charged": 0, "uncertain": 0, "settled": 0, "per_attempt": outputs * PRICE,
                  "attempts_allowed": 3, "attempt_count": 0, "lease_gen": 0, "deadline_s": 10**9,
                  "deadline": FAR, "created_at": self.now, "updated_at": self.now, "idem_key": job_id}
        available = self.store.ledger("acme")["available"]
        result = self.store.admit("acme", job_id, job_id, fingerprint="f", ceiling=ceiling,
                                  fields={k: str(v) for k, v in record.items()}, workflow=b"{}", status=202,
                                  now_ms=self.tick(), idem_ttl_s=60, outbox_delay_ms=0)
        assert (result.code is Code.CREATED) == (ceiling <= available)
        if result.code is Code.CREATED:
            self.model[job_id] = {"state": "queued", "gen": 0, "outputs": outputs, "stored": set(), "starts": 1}

    def pick(self, data: st.DataObject, *states: str) -> str | None:
        """A job, usually one in ``states`` (where the rule can act), sometimes any job."""
        fitting = sorted(j for j, job in self.model.items() if job["state"] in states)
        pool = fitting if fitting and data.draw(st.integers(0, 4)) else sorted(self.model)
        return data.draw(st.sampled_from(pool)) if pool else None

    @rule(target=claims, data=st.data())
    def claim(self, data: st.DataObject):
        job_id = self.pick(data, "queued")
        if job_id is None:
            return None
        claim = self.store.claim(job_id, worker="w", now_ms=self.tick(), lease_ms=1000, operation_id="op",
                                 servers={"sim": 1000})
        job = self.model[job_id]
        assert (claim is not None) == (job["state"] == "queued")
        if claim is None:
            return None
        job.update(state="running", gen=claim.generation)
        return claim

    @rule(target=claims, data=st.data())
    def claim_reconcile(self, data: st.DataObject):
        job_id = self.pick(data, "reconciling")
        if job_id is None:
            return None
        self.far += 10_000  # past any earlier reconciler's lease: a live lease would (rightly) refuse
        rec = self.store.claim_reconcile(job_id, worker="r", now_ms=self.far, lease_ms=1000)
        job = self.model[job_id]
        assert (rec is not None) == (job["state"] == "reconciling")
        if rec is None:
            return None
        job["gen"] = rec.claim.generation
        return rec.claim

    @rule(claim=claims)
    def submit_and_charge(self, claim) -> None:
        if claim is None:
            return
        job = self.model[claim.job_id]
        if self.holds(claim) and job.get("cancel"):
            with pytest.raises(CancelRequested):
                self.store.mark_submit(claim, now_ms=self.tick(), epoch="e", lease_ms=1000)
            return
        if self.fenced(claim, lambda: self.store.mark_submit(claim, now_ms=self.tick(), epoch="e", lease_ms=1000)):
            self.store.charge(claim, job["outputs"] * PRICE)

    @rule(claim=claims, index=st.integers(0, 2))
    def store_output(self, claim, index: int) -> None:
        if claim is None or index >= self.model[claim.job_id]["outputs"]:
            return
        if self.fenced(claim, lambda: self.store.store_output(claim, index, {"sha256": "a"}, now_ms=self.tick())):
            self.model[claim.job_id]["stored"].add(index)

    @rule(claim=claims)
    def produce_everything_and_complete(self, claim) -> None:
        if claim is None or not self.holds(claim):
            return
        job = self.model[claim.job_id]
        for index in range(job["outputs"]):
            self.store.store_output(claim, index, {"sha256": "a"}, now_ms=self.tick())
            job["stored"].add(index)
        self.store.finish(claim, "completed", now_ms=self.tick())
        job["state"] = "cancelled" if job.get("cancel") else "completed"  # a cancel request wins

    @rule(claim=claims, outcome=st.sampled_from(["completed", "failed", "cancelled"]))
    def finish(self, claim, outcome: str) -> None:
        if claim is None:
            return
        job = self.model[claim.job_id]
        if outcome == "completed" and self.holds(claim) and len(job["stored"]) < job["outputs"]:
            with pytest.raises(IncompleteOutputs):
                self.store.finish(claim, outcome, now_ms=self.tick())
            return
        if self.fenced(claim, lambda: self.store.finish(claim, outcome, now_ms=self.tick())):
            job["state"] = "cancelled" if outcome == "completed" and job.get("cancel") else outcome

    @rule(claim=claims)
    def retry(self, claim) -> None:
        if claim is not None and self.fenced(
                claim, lambda: self.store.retry(claim, now_ms=self.tick(), delay_ms=0, error_class="transient")):
            self.model[claim.job_id]["state"] = "retry_wait"

    @rule(claim=claims)
    def unknown_outcome(self, claim) -> None:
        if claim is None:
            return
        job = self.model[claim.job_id]
        if job["state"] == "running" and job["gen"] == claim.generation:
            self.store.begin_reconcile(claim.job_id, now_ms=self.tick(), reason="u", claim=claim)
            job.update(state="reconciling", gen=job["gen"] + 1)  # the worker hands the job over
        else:
            with pytest.raises(StaleLease):
                self.store.begin_reconcile(claim.job_id, now_ms=self.tick(), reason="u", claim=claim)

    @rule(data=st.data())
    def lease_expires(self, data: st.DataObject) -> None:
        job_id = self.pick(data, "running")
        if job_id is None:
            return
        moved = self.store.begin_reconcile(job_id, now_ms=FAR, reason="lease_expired")
        job = self.model[job_id]
        assert moved == (job["state"] == "running")
        if moved:
            job.update(state="reconciling", gen=job["gen"] + 1)  # the takeover fences the worker out

    @rule(claim=claims, executed=st.booleans())
    def resolve_uncertain(self, claim, executed: bool) -> None:
        if claim is not None:
            self.fenced(claim, lambda: self.store.resolve_uncertain(claim, executed=executed))

    @rule(claim=claims)
    def review(self, claim) -> None:
        if claim is None:
            return
        job = self.model[claim.job_id]
        if job["state"] == "reconciling" and self.holds(claim):
            self.store.send_to_review(claim, now_ms=self.tick(), expires_in_ms=FAR, reason="r")
            job["state"] = "needs_review"

    @rule(data=st.data(), decision=st.sampled_from(["retry", "failed", "completed"]))
    def resolve_review(self, data: st.DataObject, decision: str) -> None:
        job_id = self.pick(data, "needs_review")
        if job_id is None:
            return
        job = self.model[job_id]
        ok = job["state"] == "needs_review" and (decision != "completed" or len(job["stored"]) == job["outputs"])
        if ok:
            self.store.resolve_review(job_id, decision, now_ms=self.tick(), reason="operator")
            job["state"] = "queued" if decision == "retry" else decision
        else:
            with pytest.raises((NotAllowed, IncompleteOutputs)):
                self.store.resolve_review(job_id, decision, now_ms=self.tick(), reason="operator")

    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        job_id = self.pick(data, "retry_wait")
        if job_id is None:
            return
        promoted = self.store.promote(job_id, now_ms=self.tick())
        job = self.model[job_id]
        assert (promoted == "queued") == (job["state"] == "retry_wait")
        if promoted:
            job["state"] = "queued"

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = self.pick(data, "queued", "retry_wait", "running", "reconciling", "needs_review")
        if job_id is None:
            return
        job = self.model[job_id]
        state, _ = self.store.cancel(job_id, now_ms=self.tick())
        if job["state"] in ("queued", "retry_wait", "needs_review"):
            job["state"] = "cancelled"
        elif job["state"] in ("running", "reconciling"):
            job["cancel"] = True
        assert state == job["state"]

    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        job_id = self.pick(data, "failed")
        if job_id is None:
            return
        job = self.model[job_id]
        try:
            self.store.replay(job_id, now_ms=self.tick())
        except (NotAllowed, InsufficientAllowance) as refused:
            assert job["state"] != "failed" or isinstance(refused, InsufficientAllowance)
            return
        assert job["state"] == "failed"
        job.update(state="queued", starts=job["starts"] + 1, cancel=False)

    @invariant()
    def states_match_the_model_and_every_transition_is_legal(self) -> None:
        for job_id, job in self.model.items():
            assert self.store.job(job_id)["state"] == job["state"]
            events = self.store.events(job_id)
            assert all((e["from"], e["to"]) in LEGAL for e in events), events
            assert sum(1 for e in events if e["to"] in TERMINAL and e["from"] != e["to"]) <= job["starts"]

    @invariant()
    def ledger_balances_and_equals_the_sum_of_its_jobs(self) -> None:
        ledger = self.store.ledger("acme")
        assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
        assert min(ledger.values()) >= 0
        jobs = [self.store.job(job_id) for job_id in self.model]
        assert ledger["reserved"] == sum(int(j["reserved"]) + int(j["charged"]) for j in jobs)
        assert ledger["uncertain"] == sum(int(j["uncertain"]) for j in jobs)
        assert ledger["settled"] == sum(int(j["settled"]) for j in jobs)
        for j in jobs:
            if j["state"] in TERMINAL:
                assert (j["reserved"], j["charged"], j["uncertain"]) == ("0", "0", "0")

    @invariant()
    def global_figures_agree_with_the_jobs(self) -> None:
        """What /metrics, `reckon status` and admission read in O(1) is exactly the sum over jobs."""
        assert audit(self.store.redis, ["acme"]) == []

    def teardown(self) -> None:
        self.store.redis.close()


def test_job_state_machine_and_ledger_against_a_model(redis_server: str) -> None:
    Jobs.redis_url = redis_server
    run_state_machine_as_test(Jobs, settings=hsettings(
        max_examples=60, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))
