"""Steps on whole jobs that the sweeper and operators take (promote, redeliver, purge, rearm,
cancel, replay, a review's decision), each one Lua script: the mixin ``Store`` inherits."""

from __future__ import annotations

from typing import Any, Sequence

from pipeline.errors import InputUnknown, InsufficientAllowance, ReckonError
from pipeline.state import keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.reads import Reads
from pipeline.state.scripts import Code, Scripts, raise_for


def at(now_ms: int | None) -> int | str:
    """A script's ``now`` argument: '' lets the script read Redis's clock (production);
    tests pass a number to control time."""
    return "" if now_ms is None else now_ms


class Sweeps(Reads):
    """Scripted steps that hold no lease; ``scripts`` are the client's loaded scripts, ``retention``
    how long a finished job is kept (ms, '' for at once: ``Store``)."""

    scripts: Scripts
    retention: int | str

    def resolve_review(self, job_id: str, decision: str, *, reason: str, now_ms: int | None = None) -> str:
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "resolve-review",
            [j.record, t.ledger, t.review, t.queued, t.outbox, t.dead, j.events, t.counts, j.outputs, t.done,
             j.workflow, t.shard.wake, *t.shard.globals, *j.parts, t.shard.fleet],
            [at(now_ms), decision, reason, self.retention],
            durable=True,
        )
        return self._check(reply, j)[1]

    def promote(self, job_id: str, *, now_ms: int | None = None) -> str | None:
        """retry_wait -> queued (or failed past the deadline) when due; the new state or None."""
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "promote", [j.record, t.ledger, t.retry, t.queued, t.outbox, j.events, t.counts, t.dead, t.done,
                        j.workflow, t.shard.wake, *t.shard.globals],
            [at(now_ms), job_id, self.retention],
        )
        return reply[1] if Code(reply[0]) is Code.OK else None

    def redeliver(self, job_id: str, state: str, *, window_ms: int, now_ms: int | None = None) -> str | None:
        """A queued or reconciling job not claimed within its window: its priority when it is to be
        published again; None when it is not due, failed past its deadline, or moved on."""
        j = JobKeys(job_id)
        t = j.tenant
        index = t.queued if state == "queued" else t.reconcile
        reply = self.scripts("redeliver", [j.record, index, t.ledger, t.dead, j.events, t.counts, t.done,
                                           j.workflow, t.shard.wake, *t.shard.globals, t.shard.fleet,
                                           t.shard.parked, t.shard.called],
                             [at(now_ms), job_id, state, window_ms, self.retention])
        return reply[2] if Code(reply[0]) is Code.OK else None

    def purge(self, job_id: str, *, retention_ms: int, now_ms: int | None = None) -> bool:
        """Remove a finished job past its retention with everything it owns, the ids of its adjustments
        included; False if not due or gone."""
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts("purge", [j.record, j.attempts, j.events, j.outputs, j.workflow, t.jobs, t.dead, t.done,
                                       j.progress, j.progress_seen, t.counts, t.bookings, t.booking_log,
                                       *t.shard.globals],
                             [job_id, at(now_ms), retention_ms])
        return Code(reply[0]) is Code.OK

    def take_due(self, shard: keys.ShardKeys, *, limit: int, hold_ms: int,
                 now_ms: int | None = None) -> tuple[int, list[str]]:
        """The shard's tenants with work due, each held for ``hold_ms`` so a second sweeper takes others;
        and the time they were taken at, on the clock of the shard's primary (ms)."""
        reply = self.scripts("take-due", [shard.wake], [at(now_ms), limit, hold_ms])
        return int(reply[1]), reply[2:]

    def rearm(self, tenant: str, *, window_ms: int, retention_ms: int) -> int | None:
        """Set the tenant's wake entry to when its next work is due; None when it has none."""
        t = TenantKeys(tenant)
        reply = self.scripts("rearm", [t.shard.wake, t.leases, t.reconcile, t.queued, t.retry, t.review, t.outbox,
                                       t.done], [tenant, window_ms, retention_ms])
        return None if int(reply[1]) < 0 else int(reply[1])

    def cancel(self, job_id: str, *, now_ms: int | None = None) -> tuple[str, str]:
        """Cancel or request cancellation; (state after, external_effect)."""
        reply = self.scripts("cancel", *self._cancel_call(job_id, now_ms), durable=True)
        self._check(reply, JobKeys(job_id))
        return reply[1], reply[2]

    def cancel_many(self, job_ids: Sequence[str]) -> list[tuple[str, str] | Exception]:
        """``cancel`` of each job (all of one tenant: one shard) in one round trip; an error in its job's place."""
        outcomes: list[tuple[str, str] | Exception] = []
        for job_id, reply in zip(job_ids, self.scripts.many(
                "cancel", [self._cancel_call(job_id, None) for job_id in job_ids], durable=True), strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                self._check(reply, JobKeys(job_id))
                outcomes.append((reply[1], reply[2]))
            except ReckonError as refused:
                outcomes.append(refused)
        return outcomes

    def _cancel_call(self, job_id: str, now_ms: int | None) -> tuple[list[str], list[Any]]:
        j = JobKeys(job_id)
        t = j.tenant
        return ([j.record, t.ledger, t.queued, t.retry, j.events, t.counts, t.review, t.done,
                 j.workflow, t.shard.wake, t.shard.parked, *t.shard.globals, *j.parts, t.shard.fleet],
                [at(now_ms), self.retention])

    def replay(self, job_id: str, *, now_ms: int | None = None) -> None:
        """Queue a failed job again; InputUnknown (its sha256s) if the tenant no longer has an input it names."""
        j = JobKeys(job_id)
        t = j.tenant
        digests = [d for d in (self.redis.hget(j.record, "inputs") or "").split(",") if d]  # fixed at admission
        input_keys = [t.inputs, t.shard.inputs_used, *(t.input_jobs(d) for d in digests)] if digests else []
        reply = self.scripts(
            "replay", [j.record, t.ledger, t.dead, t.queued, t.outbox, j.events, t.counts, t.done, t.shard.wake,
             *t.shard.globals, t.bookings, t.booking_log, *input_keys],
            [at(now_ms), *digests]
        )
        if Code(reply[0]) is Code.INSUFFICIENT_ALLOWANCE:
            raise InsufficientAllowance(reply[1], reply[2])
        if Code(reply[0]) is Code.INPUT_UNKNOWN:
            raise InputUnknown(tuple(reply[1:]))
        self._check(reply, j)

    def _check(self, reply: list[Any], job: JobKeys) -> list[Any]:
        code = Code(reply[0])
        if code is not Code.OK:
            if code is Code.STALE_LEASE:
                self.redis.hincrby(job.shard.stats, "stale_writes_rejected", 1)
            raise_for(code, reply)
        return reply
