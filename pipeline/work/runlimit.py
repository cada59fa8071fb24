"""The bound on one attempt's execution: a prompt that has run its job's ``max_seconds`` is interrupted at
its server (docs/costs.md "Per-second prices"). Used by a worker's own wait and by the watcher."""

from __future__ import annotations

import logging
import time
from typing import Callable

from pipeline.claims import Reconcile
from pipeline.errors import ProviderError
from pipeline.providers.base import Provider

log = logging.getLogger(__name__)

#: The job's error reason when reckon interrupted its prompt at ``max_seconds``.
MAX_SECONDS_EXCEEDED = "max_seconds_exceeded"


class RunLimit:
    """Says, once, when a prompt first seen running at least ``max_seconds`` ago (by ``clock``,
    monotonic seconds) is due to be interrupted; 0: never. The server starts a prompt before reckon
    sees it running, so by the server's own timestamps it has run at least as long when stopped."""

    def __init__(self, max_seconds: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_seconds, self.clock = max_seconds, clock
        self.since: float | None = None
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
