"""Failures by evidence: one router decides retry, reconcile or dead-letter, and one
Dramatiq middleware (replacing Dramatiq's ``Retries``) applies it to every message.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable

import dramatiq
from dramatiq.middleware import Middleware

from pipeline.claims import Claim
from pipeline.errors import (
    AttemptFailed,
    ExecutionFailed,
    InvalidInput,
    PolicyRejected,
    ProviderAuthFailed,
    StaleLease,
    UnknownOutcome,
)
from pipeline.fleet import able, attempt_ceiling
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.scripts import ReplicationTimeout
from pipeline.state.store import Store
from pipeline.work.executor import Executor

log = logging.getLogger(__name__)

#: Failures no retry can fix: the request or the policy must change.
TERMINAL = (InvalidInput, PolicyRejected, ExecutionFailed)


def backoff(attempt: int, *, base: float, cap: float, retry_after: float | None,
            rng: Callable[[], float] = random.random) -> float:
    """Capped exponential backoff with full jitter; a larger Retry-After wins."""
    delay = rng() * min(cap, base * 2 ** max(0, attempt - 1))
    return max(delay, retry_after or 0.0)


class Router:
    """Applies the next step for a failed attempt. Returns the action taken:
    ``retry``, ``reconcile``, ``dead_letter`` or ``cancelled``."""

    def __init__(self, store: Store, settings: Settings, budget: str = "comfyui", *,
                 rng: Callable[[], float] = random.random) -> None:
        self.store, self.settings, self.budget, self.rng = store, settings, budget, rng
        #: A retry may run on any server of the fleet and is billed a whole run there: it is affordable
        #: at every output of the job times the dearest one's price.
        self.servers = settings.servers()

    def route(self, failure: AttemptFailed, *, base: float | None = None, cap: float | None = None) -> str:
        claim, cause = failure.claim, failure.cause
        if isinstance(cause, UnknownOutcome):
            self.store.begin_reconcile(claim.job_id, reason=cause.error_class, claim=claim)
            return "reconcile"
        job = self.store.job(claim.job_id)
        if job is None:  # purged under a live lease: nothing to route (the guard fails the message)
            raise LookupError(f"job {claim.job_id} not found")
        if job.get("cancel_requested") == "1":
            self.store.finish(claim, "cancelled", reason="cancelled")
            return "cancelled"
        if isinstance(cause, ProviderAuthFailed):  # that server's credentials, not the job nor the fleet
            self.store.block_provider(claim.server, "provider_credentials")
            self.store.retry(claim, delay_ms=0, error_class=cause.error_class, free=True)
            return "retry"
        if isinstance(cause, TERMINAL):
            return self._dead_letter(claim, cause.error_class, cause.reason, cause.detail)
        delay = backoff(int(job.get("attempt_count", 1)), retry_after=cause.retry_after, rng=self.rng,
                        base=self.settings.retry_base_seconds if base is None else base,
                        cap=self.settings.retry_cap_seconds if cap is None else cap)
        blocker = self._blocker(job, self.store.server_ms(keys.JobKeys(claim.job_id).shard), delay)
        if blocker is None and not self.store.budget(
            self.budget, "take", self.settings.retry_cost_tokens, self.settings.retry_budget_tokens
        ):
            blocker = "retry_budget_exhausted"
        if blocker:
            return self._dead_letter(claim, blocker, cause.error_class)
        self.store.retry(claim, delay_ms=int(delay * 1000), error_class=cause.error_class)
        return "retry"

    def _blocker(self, job: dict[str, str], now: int, delay: float) -> str | None:
        """Why another attempt may not be made, or None. Its cost is what the provider bills for it:
        ComfyUI runs the whole graph for a prompt, so a retry asking only for the missing outputs
        (stored ones are kept, not made again for the job) is billed every output of the job
        (docs/costs.md, "What a retry is afforded at"): the job's remaining reservation must hold
        that run at the dearest price it may run at, else it could be booked past what is reserved."""
        if int(job["attempt_count"]) >= int(job["attempts_allowed"]):
            return "attempts_exhausted"
        if self._whole_run(job) > int(job["reserved"]):
            return "reservation_exhausted"
        if now + (delay + self.settings.min_attempt_seconds) * 1000 >= int(job["deadline"]):
            return "deadline_exceeded"
        return None

    def _whole_run(self, job: dict[str, str]) -> int:
        """What another attempt may cost on the dearest server it may run on (of those the job's workflow
        can run on, ``servers``, set at admission, else of the fleet): every output at its price, and its
        ``max_seconds`` at its price per second."""
        names = able([s.name for s in self.servers], job.get("servers"))
        return attempt_ceiling([s for s in self.servers if s.name in names], int(job["outputs_requested"]),
                               int(job.get("max_seconds") or 0))

    def _dead_letter(self, claim: Claim, error_class: str, reason: str, detail: dict[str, str] | None = None) -> str:
        self.store.finish(claim, "failed", error_class=error_class, reason=reason, detail=detail)
        return "dead_letter"


class FailureRouter(Middleware):
    """Routes every failed message by error class: retry, reconcile, dead-letter or drop.

    Dramatiq swallows exceptions raised in after-hooks, so routing runs under a
    guard that fails the message (Dramatiq's dead letters keep it) instead of
    letting it be acknowledged and forgotten. The job itself is never lost: a
    job whose routing failed still holds its lease, and the sweeper reconciles it
    when the lease expires.
    """

    def __init__(self, router: Callable[[], Router]) -> None:
        self.router = router

    @property
    def actor_options(self) -> set[str]:
        #: Per-actor backoff (seconds), a message option overriding the actor's; and ``throws``,
        #: the exceptions Dramatiq logs as expected (this middleware routes them) instead of errors.
        return {"retry_backoff_base", "retry_backoff_cap", "throws"}

    def after_process_message(self, broker: dramatiq.Broker, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if exception is None:
            return
        try:
            action = self._route(broker, message, exception)
        except ReplicationTimeout as unconfirmed:  # routing's own write stands on the primary
            log.warning("message %s: %s; dropped, its lease will expire and be reconciled",
                        message.message_id, unconfirmed)
            return
        except Exception:
            log.critical("routing failed for message %s; failing it", message.message_id, exc_info=True)
            message.fail()
            return
        if action == "dead_letter":
            message.fail()

    def _route(self, broker: dramatiq.Broker, message: Any, exception: BaseException) -> str:
        if isinstance(exception, StaleLease):
            log.info("message %s: lease lost to a newer claim; dropped", message.message_id)
            return "drop"
        if isinstance(exception, ReplicationTimeout):  # the write stands on the primary, unconfirmed
            log.warning("message %s: %s; dropped, its lease will expire and be reconciled",
                        message.message_id, exception)
            return "drop"
        if not isinstance(exception, AttemptFailed):
            log.error("message %s: unexpected %s; its lease will expire and be reconciled",
                      message.message_id, type(exception).__name__)
            return "dead_letter"
        actor = broker.get_actor(message.actor_name)
        option = lambda name: message.options.get(name, actor.options.get(name))  # noqa: E731
        action = self.router().route(exception, base=option("retry_backoff_base"), cap=option("retry_backoff_cap"))
        log.info("message %s: %s -> %s", message.message_id, exception.cause.error_class, action)
        return action


class Unpark(Middleware):
    """After a message whose job gave its dispatch slot back (finished, retried or reviewed), publishes
    parked jobs again while the fleet has free slots: its own shard's, and with shards, first those of
    the shards waiting for the freed server, in turn (pipeline/state/calls.py). A job taken from the
    parked set and not published (this process died) is still queued: the sweeper redelivers it."""

    def __init__(self, executor: Callable[[], Executor], publish: Callable[[str, str], None]):
        self.executor, self.publish = executor, publish

    def after_process_message(self, broker: dramatiq.Broker, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        try:
            for job_id in called_after(self.executor(), message.args[0]):
                self.publish(job_id, "unparked")
        except Exception:  # the sweeper unparks on its next pass
            log.warning("unpark after message %s failed", message.message_id, exc_info=True)


def called_after(executor: Executor, job_id: str) -> list[str]:
    """The parked jobs to call after this thread's step on ``job_id`` gave a dispatch slot back (none if it
    gave none): its shard's, and with shards, first those of the shards waiting for the freed server."""
    shard = keys.JobKeys(job_id).shard  # the shard whose slot the step may have freed
    wait_ms = executor.settings.batch_max_wait_seconds * 1000
    store = executor.store  # the jobs called, from the shards waiting for the freed server in turn
    return store.calls.after_free(shard, store.freed(), executor.fleet.caps(), batch_wait_ms=wait_ms)
