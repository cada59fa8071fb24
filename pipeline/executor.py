"""Attempts and reconciliations of jobs. Every write is fenced by the lease generation.

``Executor.run`` makes one attempt: claim, mark the submission, submit, wait,
store outputs, finish. ``Executor.reconcile`` asks the provider what became of
an attempt whose outcome is unknown, before anything is paid for again. Provider
errors leave as ``AttemptFailed`` for the routing middleware to decide.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable

import redis

from . import faultpoints
from .blobs import BlobStore
from .errors import (
    AttemptFailed,
    CancelRequested,
    DeadlineExceeded,
    IncompleteOutputs,
    NotExecuted,
    OperationFailed,
    PossibleDuplicate,
    ProviderError,
    StaleLease,
    UnknownOutcome,
)
from .providers.base import OperationStatus, OutputRef, Provider
from .settings import Settings
from .store import Claim, Reconcile, Store

log = logging.getLogger(__name__)
#: Reconcile claims of one job after which, once past its age limit, it goes to review without
#: asking again (each earlier try died before it could end: a crash loop, not a slow provider).
MAX_RECONCILE_CLAIMS = 20


def worker_name() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{threading.get_ident()}"


class Heartbeat:
    """Renews a claim's lease every third of its length until stopped or fenced out.

    The lease lives on Redis's clock; this thread only says "still here".
    """

    def __init__(self, store: Store, claim: Claim, *, lease_ms: int) -> None:
        self.store, self.claim, self.lease_ms = store, claim, lease_ms
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.job_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self.lost.is_set():
            raise StaleLease("lease lost while running")

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            try:
                self.store.heartbeat(self.claim, lease_ms=self.lease_ms)
            except StaleLease:
                self.lost.set()
                return
            except redis.RedisError:
                log.warning("heartbeat failed for %s; retrying", self.claim.job_id)


class Executor:
    def __init__(
        self, store: Store, provider: Provider, blobs: BlobStore, settings: Settings, *,
        new_operation_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store, self.provider, self.blobs, self.settings = store, provider, blobs, settings
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.new_operation_id, self.sleep = new_operation_id, sleep

    # -- attempts ---------------------------------------------------------------------

    def run(self, job_id: str, worker: str | None = None) -> bool:
        """Run one attempt if the job is claimable; False for a duplicate, finished or deferred job."""
        faultpoints.reached("before_claim")
        blocked = self.store.provider_block(self.provider.name)
        if blocked:
            self.store.defer(job_id, delay_ms=int(self.settings.auth_recheck_seconds * 1000), reason=blocked)
            return False
        claim = self.store.claim(
            job_id, worker=worker or worker_name(), lease_ms=self.lease_ms,
            operation_id=self.new_operation_id(), provider=self.provider.name,
            min_attempt_ms=int(self.settings.min_attempt_seconds * 1000),
        )
        if claim is None:
            return False
        with Heartbeat(self.store, claim, lease_ms=self.lease_ms) as heartbeat:
            try:
                self._attempt(claim, heartbeat)
            except CancelRequested:
                self.store.finish(claim, "cancelled", reason="cancelled")
                return True
            except DeadlineExceeded:  # nothing was submitted: fail it now, settled, nothing paid
                self.store.finish(claim, "failed", error_class="deadline_exceeded",
                                  reason="deadline_passed_before_submission")
                return True
            except ProviderError as exc:
                raise AttemptFailed(claim, exc) from exc
            self.store.finish(claim, "completed")
        self.store.budget(self.provider.name, "refund", self.settings.retry_refund_tokens,
                          self.settings.retry_budget_tokens)
        return True

    def _attempt(self, claim: Claim, heartbeat: Heartbeat) -> None:
        """Ask the provider for every missing output and store what it produced."""
        job, stored, workflow = self.store.attempt_inputs(claim.job_id)  # all read before the mark
        missing = [index for index in range(int(job["outputs_requested"])) if index not in stored]
        if not missing:
            return
        epoch = self.provider.epoch()
        marked = time.monotonic()
        self.store.mark_submit(claim, epoch=epoch, lease_ms=self.lease_ms,  # renews the lease from `marked`
                               min_attempt_ms=int(self.settings.min_attempt_seconds * 1000))
        if (time.monotonic() - marked) * 1000 >= self.lease_ms / 2:  # frozen since: the lease may be gone
            raise UnknownOutcome("submission_window_passed")
        self.provider.submit(claim.operation_id, workflow, missing)
        faultpoints.reached("after_submit")
        deadline = time.monotonic() + (int(job["deadline"]) - claim.claimed_ms) / 1000
        try:
            status = self._wait(claim, heartbeat, deadline)
            self.store.charge(claim, len(status.outputs) * self.provider.price_per_output)
            self._store_outputs(claim, status.outputs, heartbeat)
        except UnknownOutcome:
            raise
        except ProviderError as exc:  # submitted: only asking again by the same id is evidence
            raise UnknownOutcome(f"read_failed_{exc.error_class}") from exc
        faultpoints.reached("after_outputs")
        if status.state == "failed" or len(status.outputs) < len(missing):
            raise OperationFailed(status.error or "provider_outputs_missing")

    def _wait(self, claim: Claim, heartbeat: Heartbeat, deadline: float) -> OperationStatus:
        while True:
            heartbeat.check()
            status = self.provider.status(claim.operation_id)
            if status.state in ("completed", "failed"):
                return status
            if status.state == "unknown":
                raise UnknownOutcome("operation_not_found")
            if time.monotonic() >= deadline:
                raise UnknownOutcome("deadline_passed_while_running")
            self.sleep(self.settings.poll_interval_seconds)

    def _store_outputs(self, claim: Claim, refs: list[OutputRef], heartbeat: Heartbeat) -> None:
        for ref in refs:
            heartbeat.check()
            data = self.provider.fetch(ref)
            digest = self.blobs.put(data)
            record: dict[str, Any] = {"sha256": digest, "bytes": len(data), "content_type": ref.content_type}
            self.store.store_output(claim, ref.index, record)

    # -- reconciliation ---------------------------------------------------------------

    def reconcile(self, job_id: str, worker: str | None = None) -> bool:
        """Settle an unknown outcome with the provider's own record; False if not reconcilable now."""
        rec = self.store.claim_reconcile(job_id, worker=worker or worker_name(), lease_ms=self.lease_ms)
        if rec is None:
            return False
        if rec.claims > MAX_RECONCILE_CLAIMS and self._too_old(rec):
            self._review(rec.claim, "reconcile_timed_out")  # every try died before it could end
            return True
        with Heartbeat(self.store, rec.claim, lease_ms=self.lease_ms) as heartbeat:
            try:
                self._reconcile(rec, heartbeat)
            except (AttemptFailed, StaleLease):
                raise
            except Exception:  # e.g. storage failing: ask again later, until the age limit
                log.exception("reconcile %s failed; asking again later", rec.claim.job_id)
                self._later(rec)
        return True

    def _reconcile(self, rec: Reconcile, heartbeat: Heartbeat) -> None:
        """Every provider error here means "ask again later" (never "pay again"), until the
        reconciliation is older than its limit: then an operator decides."""
        claim = rec.claim
        if not rec.submitted:
            raise AttemptFailed(claim, NotExecuted("never_submitted"))
        try:
            status = self.provider.status(claim.operation_id)
            if status.state in ("pending", "running"):
                return self._later(rec)
            if status.state == "unknown":
                return self._unknowable(rec, self.provider.epoch())
            # It ran: what it is charged is what it produced (booked once per attempt).
            self.store.charge(claim, len(status.outputs) * self.provider.price_per_output)
            self._store_outputs(claim, status.outputs, heartbeat)
        except ProviderError as exc:
            log.info("reconcile %s: provider answered %s; asking again later", claim.job_id, exc.error_class)
            return self._later(rec)
        try:
            self.store.finish(claim, "completed")
        except IncompleteOutputs:  # it ran but did not make them all: retry the missing ones
            raise AttemptFailed(claim, OperationFailed(status.error or "provider_outputs_missing")) from None

    def _too_old(self, rec: Reconcile) -> bool:
        return rec.claim.claimed_ms - rec.since_ms >= self.settings.reconcile_max_seconds * 1000

    def _later(self, rec: Reconcile) -> None:
        """Ask again after the interval, or hand the job to an operator once reconciliation
        has gone on longer than ``reconcile_max_seconds`` (no livelock, no silent loss)."""
        if self._too_old(rec):
            return self._review(rec.claim, "reconcile_timed_out")
        self.store.reconcile_later(rec.claim, delay_ms=int(self.settings.reconcile_interval_seconds * 1000))

    def _review(self, claim: Claim, reason: str) -> None:
        self.store.send_to_review(claim, expires_in_ms=self.settings.review_expiry_seconds * 1000, reason=reason)

    def _unknowable(self, rec: Reconcile, epoch: str) -> None:
        """The provider has no record of the operation: proof of non-execution only if it
        has not restarted since we submitted (same epoch); otherwise the policy decides."""
        claim = rec.claim
        if rec.epoch and epoch == rec.epoch:
            submitted = rec.submitted_ms or rec.since_ms  # a record without the time: the latest it can be
            if claim.claimed_ms - submitted < self.settings.submit_settle_seconds * 1000:
                return self._later(rec)  # the request may still be on its way to the provider
            self.store.resolve_uncertain(claim, executed=False)
            raise AttemptFailed(claim, NotExecuted("not_found_same_epoch"))
        uncertain = int((self.store.job(claim.job_id) or {}).get("uncertain", 0))
        allowance = self.settings.duplicate_cost_allowance
        if 0 < allowance and uncertain <= allowance:
            self.store.resolve_uncertain(claim, executed=True)  # paid as if it ran: a possible duplicate
            raise AttemptFailed(claim, PossibleDuplicate("unknowable_retried_within_allowance"))
        self._review(claim, "outcome_unknowable")
