"""The bound on one attempt's execution: a prompt that has run its job's ``max_seconds`` is interrupted at
its server (docs/costs.md "Per-second prices"). Used by a worker's own wait and by the watcher."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

from pipeline.claims import Claim, Reconcile
from pipeline.errors import ProviderError, UnknownOutcome
from pipeline.providers.base import OperationStatus, Provider
from pipeline.work.leases import Held

log = logging.getLogger(__name__)

#: The job's error reason when reckon interrupted its prompt at ``max_seconds``.
MAX_SECONDS_EXCEEDED = "max_seconds_exceeded"


class RunLimit:
    """Says, once, when a prompt running since ``since`` (by ``clock``, monotonic seconds; None: from
    when it is first seen running) for at least ``max_seconds`` is due to be interrupted; 0: never. The
    server starts a prompt before reckon sees it running, so by the server's own timestamps it has run
    at least as long when stopped."""

    def __init__(self, max_seconds: int, clock: Callable[[], float] = time.monotonic,
                 since: float | None = None) -> None:
        self.max_seconds, self.clock = max_seconds, clock
        self.since = since
        self.done = False

    def due(self, state: str) -> bool:
        if not self.max_seconds or self.done or state != "running":
            return False
        now = self.clock()
        if self.since is None:
            self.since = now
        self.done = now - self.since >= self.max_seconds
        return self.done


def interrupt_overdue(provider: Provider, rec: Reconcile, job: dict[str, str] | None) -> None:
    """Interrupt the prompt of ``rec`` that reconciliation finds still running (``job``: its record;
    None: not running) once its job's ``max_seconds`` have passed, on Redis's clock, since it was
    submitted (it started after): its deadline passed while it ran, so no worker's wait or watcher
    bounds it any more. Asked again at each check until it ends; the next check books what ran. An
    interrupt the server refuses (429, 401, down) is asked again at the next check too: the prompt runs
    on, so the attempt's outcome and its uncertain hold stay with reconciliation (ending the attempt
    retried the job with the hold still uncertain, and the next attempt's charge released it)."""
    max_seconds = int((job or {}).get("max_seconds") or 0)
    if max_seconds and rec.submitted_ms and rec.claim.claimed_ms - rec.submitted_ms >= max_seconds * 1000:
        try:
            provider.cancel(rec.claim.operation_id)
        except ProviderError as exc:
            log.warning("job %s: interrupt refused at %s (%s); asked again at the next check", rec.claim.job_id,
                        rec.claim.server, exc.reason)


def overran(status: OperationStatus, max_seconds: int, claimed_ms: int, submitted_ms: int) -> bool:
    """Whether reckon stopped this interrupted prompt at its ``max_seconds``: the wait that interrupted it
    says so (``wait_ended``); else it ran them by its server's own timestamps, or, from a server that
    gives none, from its submission to ``claimed_ms`` (both on Redis's clock: the most it can have run;
    unknown without its submission's time: an operator's stop, honoured as a cancel)."""
    if status.state != "interrupted" or not max_seconds:
        return False
    if status.error == MAX_SECONDS_EXCEEDED:
        return True
    ran = status.seconds_ms
    if ran is None:
        ran = claimed_ms - submitted_ms if submitted_ms else 0
    return ran >= max_seconds * 1000


def wait_ended(provider: Provider, claim: Claim, heartbeat: Held, deadline: float, max_seconds: int,
               every: float, sleep: Callable[[float], None]) -> OperationStatus:
    """A worker's own wait: poll the prompt every ``every`` seconds until it ends, interrupting it once it
    has run ``max_seconds`` (``RunLimit``: an interrupted end then says so in its ``error``, whatever
    timestamps the server gives); past ``deadline`` (monotonic) its outcome is unknown."""
    limit = RunLimit(max_seconds)
    while True:
        heartbeat.check()
        status = provider.status(claim.operation_id)
        heartbeat.progress()
        if status.state == "interrupted" and limit.done:
            return replace(status, error=MAX_SECONDS_EXCEEDED)
        if status.state not in ("pending", "running"):
            return status
        if limit.due(status.state):
            log.info("job %s ran past its max_seconds at %s; interrupting it", claim.job_id, claim.server)
            provider.cancel(claim.operation_id)
        if time.monotonic() >= deadline:
            raise UnknownOutcome("deadline_passed_while_running")
        sleep(every)
