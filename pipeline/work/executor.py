"""Attempts and reconciliations of jobs. Every write is fenced by the lease generation.

``Executor.run`` makes one attempt: claim, put its inputs on its server, mark the submission, submit,
wait, store outputs, finish. ``Executor.reconcile`` asks the provider what became of an attempt whose
outcome is unknown, before anything is paid for again. Provider errors leave as ``AttemptFailed``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, TypeVar

from pipeline import faultpoints
from pipeline.blobs import Blobs
from pipeline.claims import Claim, Reconcile
from pipeline.errors import (
    AttemptFailed,
    CancelRequested,
    DeadlineExceeded,
    DispatchPaused,
    ExecutionFailed,
    IncompleteOutputs,
    NotExecuted,
    OperationFailed,
    OutputLost,
    OutputMalformed,
    PossibleDuplicate,
    ProviderError,
    StaleLease,
    SubmitUnconfirmed,
    UnknownOutcome,
    Unreachable,
)
from pipeline.providers.base import OperationStatus, Provider
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state.scripts import ReplicationTimeout
from pipeline.state.store import Store
from pipeline.work.leases import Held, Keeper
from pipeline.work.outputs import REFUSED_REASON, store_outputs
from pipeline.work.runlimit import MAX_SECONDS_EXCEEDED, interrupt_overdue, overran, wait_ended
from pipeline.work.staging import InputNotStaged, Staging

log = logging.getLogger(__name__)
#: Reconcile claims of one job after which, once past its age limit, it goes to review without
#: asking again (each earlier try died before it could end: a crash loop, not a slow provider).
MAX_RECONCILE_CLAIMS = 20
BUDGET = "comfyui"  #: The shared retry budget (one token bucket for the whole fleet).
T = TypeVar("T")
#: A completed run's output the server cannot hand over intact: paid for, never retried blindly.
LOST = (OutputLost, OutputMalformed)
#: How often (s) at most a worker process reads a server's epoch for the submissions it marks (``_epoch``).
EPOCH_READ_S = 5.0
#: An attempt whose submit mark no replica confirmed waits this long (ms) before it is tried again.
UNCONFIRMED_RETRY_MS = 1_000

HOST = socket.gethostname()  #: This host's name, looked up once.


def _given(seen: OperationStatus | ProviderError) -> OperationStatus:
    """A status read earlier, or the error that read raised, raised again now."""
    if isinstance(seen, ProviderError):
        raise seen
    return seen


def worker_name() -> str:
    return f"{HOST}/{os.getpid()}/{threading.get_ident()}"


class Executor:
    def __init__(
        self, store: Store, fleet: Fleet, blobs: Blobs, settings: Settings, *,
        new_operation_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store, self.fleet, self.blobs, self.settings = store, fleet, blobs, settings
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.min_attempt_ms = int(settings.min_attempt_seconds * 1000)
        self.new_operation_id, self.sleep = new_operation_id, sleep
        self.keeper = Keeper(store, lease_ms=self.lease_ms, refund=lambda successes: store.refund_budget(
            BUDGET, successes * settings.retry_refund_tokens, settings.retry_budget_tokens),
            grace_s=settings.deadline_grace_seconds, stall_s=settings.stall_seconds)
        #: Server -> (when read, monotonic s; its epoch), for submissions only (``_epoch``).
        self._epochs: dict[str, tuple[float, str]] = {}
        self.staging = Staging(store, blobs)  # each input on the attempt's server before its prompt

    # -- attempts ---------------------------------------------------------------------

    def run(self, job_id: str, worker: str | None = None) -> bool:
        """Run one attempt if the job is claimable and a server has a free slot; False for a
        duplicate, finished or parked job."""
        faultpoints.reached("before_claim")
        claim = self.store.claim(
            job_id, worker=worker or worker_name(), lease_ms=self.lease_ms, operation_id=self.new_operation_id(),
            servers=self.fleet.caps(), prices=self.fleet.prices(), min_attempt_ms=self.min_attempt_ms,
        )
        if claim is None:
            return False
        provider = self.fleet[claim.server]
        with self.keeper.hold(claim, deadline_ms=claim.inputs.deadline_ms if claim.inputs else None) as heartbeat:
            try:
                status = self._attempt(claim, provider, heartbeat)
                if status is not None:  # max_seconds as the claim read it: no read of the record
                    bound = (claim.inputs.max_seconds if claim.inputs else 0, 0)
                    self._complete(claim, provider, status, heartbeat, bound=bound)
            except CancelRequested:
                self.store.finish(claim, "cancelled", reason="cancelled")
            except DeadlineExceeded:  # nothing was submitted: fail it now, settled, nothing paid
                self.store.finish(claim, "failed", error_class="deadline_exceeded",
                                  reason="deadline_passed_before_submission")
            except Unreachable as exc:  # nothing was sent: the server is down, not the job
                self._server_down(claim, exc)
            except DispatchPaused:  # paused since the claim: nothing sent, the attempt goes back
                self.store.retry(claim, delay_ms=0, error_class="dispatch_paused", free=True)
            except SubmitUnconfirmed:  # the mark reached no replica: nothing sent, the attempt goes back
                self.store.retry(claim, delay_ms=UNCONFIRMED_RETRY_MS, error_class="replication_timeout", free=True)
            except InputNotStaged as exc:  # an input not on the server: nothing sent, the attempt goes back
                self.staging.give_back(claim, exc)
            except LOST as exc:  # a paid output gone: reconciliation asks again, then an operator
                raise AttemptFailed(claim, UnknownOutcome(exc.reason)) from exc
            except ProviderError as exc:
                raise AttemptFailed(claim, exc) from exc
        return True

    def _attempt(self, claim: Claim, provider: Provider, heartbeat: Held) -> OperationStatus | None:
        """Ask the server for every missing output. Returns the prompt's final status, or None
        when the server's watcher follows the prompt from here (the thread is free again)."""
        inputs = claim.inputs  # read by the claim: nothing waits on Redis between the mark and the send
        assert inputs is not None, "an attempt's claim carries its inputs"
        missing = [index for index in range(inputs.outputs_requested) if index not in inputs.stored]
        if not missing:
            return OperationStatus("completed")
        self.staging.stage(claim, provider, heartbeat)  # before the mark: an upload may take a while
        epoch = self._epoch(claim.server, provider)
        marked = time.monotonic()
        try:
            self.store.mark_submit(claim, epoch=epoch, lease_ms=self.lease_ms,  # renews the lease from `marked`
                                   min_attempt_ms=self.min_attempt_ms)
        except ReplicationTimeout as exc:  # sending now could pay twice if a failover lost the mark
            raise SubmitUnconfirmed(claim.job_id) from exc
        if (time.monotonic() - marked) * 1000 >= self.lease_ms / 2:  # frozen since: the lease may be gone
            raise UnknownOutcome("submission_window_passed")
        refused = self.staging.submit(claim, provider, missing, front=inputs.priority == "interactive")
        faultpoints.reached("after_submit")
        if self.settings.watch:
            self.store.await_provider(claim, lease_ms=self.lease_ms, refused=refused)
            return None
        deadline = time.monotonic() + (inputs.deadline_ms - claim.claimed_ms) / 1000
        status = self._submitted(lambda: wait_ended(provider, claim, heartbeat, deadline, inputs.max_seconds,
                                                      self.settings.poll_interval_seconds, self.sleep))
        return replace(status, detail=status.detail or refused)

    def collect(self, job_id: str, worker: str | None = None) -> bool:
        """Store the outputs of a prompt that ended at its server and finish the job (the
        watcher saw it end); False if the job is not waiting at a server (a duplicate message).

        The prompt is read at its server before the claim (the watch list names server and
        operation), so a claim of an ended prompt books its cost in the same step; what that read
        found (or how it failed) is then what the collect goes on with, as a read under the claim
        would have, except for a cancel: a prompt still pending or running is read again under the
        claim before it is taken off its server (that proof needs a read a moment before the delete)."""
        seen = self._read_watched(job_id)
        charge = None
        if seen and isinstance(seen[1], OperationStatus) and seen[1].state not in ("pending", "running", "unknown"):
            units, ms = seen[1].cost(self.fleet.servers[seen[2]], seen[3].get("max") or 0)
            charge = (seen[0], units, "" if ms is None else f"{seen[3]['attempt']}:{ms}")
        taken = self.store.collect_claim(job_id, worker=worker or worker_name(), lease_ms=self.lease_ms,
                                         charge=charge)
        if taken is None:
            return False
        claim = taken.claim
        faultpoints.reached("collect_claimed")
        if claim.server not in self.fleet:
            raise AttemptFailed(claim, UnknownOutcome("server_not_configured"))
        provider = self.fleet[claim.server]
        with self.keeper.hold(claim, deadline_ms=taken.deadline_ms) as heartbeat:
            try:
                if seen and seen[0] == claim.operation_id:
                    status = self._submitted(lambda: _given(seen[1]))
                else:
                    status = self._submitted(lambda: provider.status(claim.operation_id))
                if status.state in ("pending", "running") and taken.cancel_requested:
                    # the proof of non-execution needs "pending" read a moment before the delete:
                    # read again, as the read before the claim spans the claim's round trip
                    status = self._submitted(lambda: provider.status(claim.operation_id))
                    if status.state in ("pending", "running"):
                        after = self._cancel_at_provider(claim, provider, status, taken.epoch)
                        if after is None:  # taken off the server's queue before it ran: ended here
                            return True
                        status = after
                if status.state in ("pending", "running"):
                    if claim.claimed_ms >= taken.deadline_ms:  # as a worker's own wait: reconcile it
                        raise UnknownOutcome("deadline_passed_while_running")
                    self.store.await_provider(claim, lease_ms=self.lease_ms)  # not ended yet: back to the watcher
                    return True
                self._complete(claim, provider, status, heartbeat, charged=taken.charged,
                               bound=(seen[3].get("max") or 0, seen[3].get("sub") or 0) if seen else None)
            except LOST as exc:  # a paid output gone: reconciliation asks again, then an operator
                raise AttemptFailed(claim, UnknownOutcome(exc.reason)) from exc
            except ProviderError as exc:
                raise AttemptFailed(claim, exc) from exc
        return True

    def _read_watched(self, job_id: str) -> tuple[str, OperationStatus | ProviderError, str, dict[str, Any]] | None:
        """The watched prompt's operation id, its status at its server (or the error reading it raised),
        the server's name and the watch entry; None if the job is not watched or its server not configured."""
        watched = self.store.watch_entry(job_id)
        if watched is None or watched["server"] not in self.fleet:
            return None
        try:
            status: OperationStatus | ProviderError = self.fleet[watched["server"]].status(watched["op"])
        except ProviderError as exc:
            status = exc
        return watched["op"], status, watched["server"], watched

    def _cancel_at_provider(self, claim: Claim, provider: Provider, before: OperationStatus,
                            epoch: str) -> OperationStatus | None:
        """The client cancelled while the prompt is at its server: take it off the server's queue, or
        interrupt it if it runs (ComfyUI interrupts only that prompt).

        Gone from queue and history right after we removed it, it never ran, provided it was pending,
        every request since answered, and the server's epoch (if it shows one) is the submission's: a
        restart that loses history cannot fit between answers a moment apart (ComfyUI takes seconds to
        start): the job ends cancelled and None is returned. Anything less is an unknown outcome."""
        try:
            provider.cancel(claim.operation_id)
        except ProviderError as exc:  # a later collect tries again; the job ends cancelled either way
            log.info("cancel of %s at %s failed (%s)", claim.job_id, claim.server, exc.reason)
            return before
        status = self._submitted(lambda: provider.status(claim.operation_id))
        if status.state != "unknown":
            return status
        if before.state != "pending" or self._submitted(provider.epoch) != epoch:
            raise UnknownOutcome("cancelled_prompt_not_found")
        self.store.finish(claim, "cancelled", reason="removed_from_provider_queue")
        return None

    def _submitted(self, ask: Callable[[], T]) -> T:
        """Ask about a submitted prompt: any provider error is an unknown outcome, because only
        asking again by the same id is evidence of what ran (a lost output stays itself)."""
        try:
            return ask()
        except (UnknownOutcome, *LOST):
            raise
        except ProviderError as exc:
            raise UnknownOutcome(f"read_failed_{exc.reason}") from exc

    def _complete(self, claim: Claim, provider: Provider, status: OperationStatus, heartbeat: Held, *,
                  charged: bool = False, bound: tuple[int, int] | None = None) -> None:
        """Book, store and finish what an ended prompt produced: its cost first (the evidence that it
        ran outlives this worker; ``charged``: the claim booked it already), then its outputs.
        ``bound``: the job's ``max_seconds`` and its submission's time on Redis's clock (None: read from
        its record when a price or an interruption needs them)."""
        if status.state == "unknown":
            raise UnknownOutcome("operation_not_found")
        server = self.fleet.servers[claim.server]
        if bound is None and (server.price_per_second or status.state == "interrupted"):
            job = self.store.job(claim.job_id) or {}
            bound = (int(job.get("max_seconds") or 0), int(job.get("submitted_at") or 0))
        max_seconds, submitted_ms = bound or (0, 0)
        if not charged:
            self.store.charge(claim, *status.cost(server, max_seconds or 0))
        refused = self._submitted(lambda: store_outputs(self.store, self.blobs, claim, provider, status.outputs,
                                                        heartbeat, uncleaned=self.settings.output_uncleaned_types))
        faultpoints.reached("after_outputs")
        if overran(status, max_seconds, claim.claimed_ms, submitted_ms):
            raise ExecutionFailed(MAX_SECONDS_EXCEEDED)  # reckon stopped it: another run would be as long
        if status.state == "interrupted":  # stopped at the server (an operator): honoured as a cancel
            self.store.finish(claim, "cancelled", reason="provider_interrupted")
        elif status.state == "failed":
            raise (OperationFailed if status.retryable else ExecutionFailed)(
                status.error or "provider_execution_error", detail=status.detail)
        elif refused:  # the same graph saves the same format: failed for good, the run paid
            raise ExecutionFailed(REFUSED_REASON, detail=refused)
        else:
            try:
                self.store.finish(claim, "completed")
            except IncompleteOutputs:  # the same graph makes the same count: retrying cannot help
                refused = status.detail or self.store.refusal(claim.job_id)  # output nodes refused at submit
                reason = "provider_refused_output_nodes" if refused else "provider_outputs_missing"
                raise ExecutionFailed(reason, detail=refused) from None
            self.keeper.refund()

    def _epoch(self, server: str, provider: Provider) -> str:
        """The server's epoch to record with a submission, read at most every ``EPOCH_READ_S``.

        Safe for the mark only: an epoch read before a restart that the submission then followed is
        another boot's, and every check that compares it (a cancel's, reconciliation's) then finds a
        restart since the submission and takes the careful path; it never proves a non-execution.
        Those checks read the server's epoch afresh, never from here."""
        now = time.monotonic()
        read = self._epochs.get(server)
        if read is None or now - read[0] >= EPOCH_READ_S:
            read = (now, provider.epoch())
            self._epochs[server] = read
        return read[1]

    def _server_down(self, claim: Claim, exc: ProviderError) -> None:
        """The server refused before anything was sent: mark it (the watcher probes it and puts it
        back) and give the attempt back; the job runs on another server, or waits for one."""
        log.warning("server %s unreachable (%s); job %s goes back to the queue", claim.server, exc.reason,
                    claim.job_id)
        self.store.block_provider(claim.server, "provider_unreachable")
        self.store.retry(claim, delay_ms=0, error_class=exc.reason, free=True)

    # -- reconciliation ---------------------------------------------------------------

    def reconcile(self, job_id: str, worker: str | None = None) -> bool:
        """Settle an unknown outcome with the provider's own record; False if not reconcilable now."""
        rec = self.store.claim_reconcile(job_id, worker=worker or worker_name(), lease_ms=self.lease_ms)
        if rec is None:
            return False
        if rec.claims > MAX_RECONCILE_CLAIMS and self._too_old(rec):
            self._review(rec.claim, "reconcile_timed_out")  # every try died before it could end
            return True
        with self.keeper.hold(rec.claim) as heartbeat:
            try:
                self._reconcile(rec, heartbeat)
            except (AttemptFailed, StaleLease):
                raise
            except Exception:  # e.g. storage failing: ask again later, until the age limit
                log.exception("reconcile %s failed; asking again later", rec.claim.job_id)
                self._later(rec)
        return True

    def _reconcile(self, rec: Reconcile, heartbeat: Held) -> None:
        """Ask the server that received the prompt, never another. Every provider error here means "ask
        again later" (never "pay again"), until the reconciliation is older than its limit: then an operator decides."""
        claim = rec.claim
        if not rec.submitted:
            raise AttemptFailed(claim, NotExecuted("never_submitted"))
        if claim.server not in self.fleet:  # no longer configured here: only its own record counts
            return self._later(rec)
        provider = self.fleet[claim.server]
        try:
            status = self._submitted(lambda: provider.status(claim.operation_id))
            if status.state in ("pending", "running"):
                interrupt_overdue(provider, rec, self.store.job(claim.job_id) if status.state == "running" else None)
                return self._later(rec)
            if status.state == "unknown":
                return self._unknowable(rec, self._submitted(provider.epoch))
            self._complete(claim, provider, status, heartbeat)  # it ran: booked once per attempt
        except LOST as exc:  # paid for, and the server cannot give it: an operator decides
            log.warning("reconcile %s: an output of a paid run is lost at %s", claim.job_id, claim.server)
            return self._review(claim, exc.error_class)
        except UnknownOutcome as exc:
            log.info("reconcile %s: provider answered %s; asking again later", claim.job_id, exc.reason)
            return self._later(rec)
        except ProviderError as exc:
            raise AttemptFailed(claim, exc) from exc

    def _too_old(self, rec: Reconcile) -> bool:
        return rec.claim.claimed_ms - rec.since_ms >= self.settings.reconcile_max_seconds * 1000

    def _later(self, rec: Reconcile) -> None:
        """Ask again after the interval, or hand the job to an operator once reconciliation
        has gone on longer than ``reconcile_max_seconds`` (no livelock, no silent loss)."""
        if self._too_old(rec):
            return self._review(rec.claim, "reconcile_timed_out")
        self.store.reconcile_later(rec.claim, delay_ms=int(self.settings.reconcile_interval_seconds * 1000))

    def _review(self, claim: Claim, reason: str) -> None:  # timed out at a server still configured: it may run there
        self.store.send_to_review(claim, expires_in_ms=self.settings.review_expiry_seconds * 1000, reason=reason,
                                  keep_slot=reason == "reconcile_timed_out" and claim.server in self.fleet)

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
