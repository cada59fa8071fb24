"""Admission and the publish confirmation, one job at a time or many in one round trip (a batch:
``admit_many``, ``confirm_many``). The Store's methods for them (``Store`` inherits ``Admits``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from pipeline.errors import DeadlineInfeasible, InputUnknown, InvalidRequest, OverLimit, UnknownTenant
from pipeline.inputs import InputName
from pipeline.state import keys
from pipeline.state.admission import FleetLimits
from pipeline.state.inputs import admission_keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import Code, Scripts
from pipeline.state.sweeps import at


@dataclass(frozen=True)
class Admission:
    code: Code
    job_id: str
    status: int = 0
    available: int = 0
    ceiling: int = 0
    #: When a created job was admitted, on Redis's clock (ms).
    created_ms: int = 0


Call = tuple[list[str], list[Any]]


class Admits:
    scripts: Scripts
    retention: int | str
    idem_ttl_s: int

    def admit(self, tenant: str, idem_key: str, job_id: str, **admission: Any) -> Admission:
        """One job's admission (``admission``: ``admit_call``'s keywords); InputUnknown if the tenant lacks
        one of the uploaded inputs the workflow names."""
        return admission_of(self.scripts("admit", *self.admit_call(tenant, idem_key, job_id, **admission),
                                         durable=True), tenant)

    def admit_call(
        self, tenant: str, idem_key: str, job_id: str, *, fingerprint: str, ceiling: int,
        fields: dict[str, str], workflow: bytes, status: int, idem_ttl_s: int,
        outbox_delay_ms: int, now_ms: int | None = None, supersedes: str = "",
        limits: FleetLimits = FleetLimits(), replay_only: bool = False, inputs: Sequence[InputName] = (),
    ) -> Call:
        """The admission script's keys and arguments for one job (``admit`` runs one, ``admit_many`` many)."""
        t, j, older = TenantKeys(tenant), JobKeys(job_id), JobKeys(supersedes or job_id)
        windows, first = t.idempotency_windows(now_ms, idem_ttl_s)
        input_keys, input_args = admission_keys(tenant, inputs)
        return (
            [t.idempotency(idem_key), t.ledger, j.record, t.jobs, t.queued, t.outbox, j.events, t.counts,
             older.record, older.events, t.retry, j.workflow, t.done, older.workflow, t.shard.wake, t.limits,
             *t.shard.globals, t.shard.admission, t.shard.fleet, *older.parts, *windows, *input_keys],
            [at(now_ms), job_id, fingerprint, ceiling, idem_ttl_s, outbox_delay_ms,
             orjson.dumps(fields), status, supersedes, workflow, limits.slots, limits.queue_cap_interactive,
             limits.queue_cap_batch, limits.interactive_target_s, keys.shard_count(), self.retention,
             int(replay_only), first, idem_key, *input_args],
        )

    def admit_many(self, tenant: str, calls: Sequence[Call]) -> list[Admission | Exception]:
        """The admissions of ``calls`` (``admit_call``'s, all of ``tenant``: one shard) in one round trip, each
        an Admission or the error its admission alone would have raised, in order."""
        outcomes: list[Admission | Exception] = []
        for reply in self.scripts.many("admit", calls, durable=True):
            try:
                outcomes.append(reply if isinstance(reply, Exception) else admission_of(reply, tenant))
            except Exception as refused:  # a refusal of this item only
                outcomes.append(refused)
        return outcomes

    def confirm_published(self, job_id: str, idem_key: str, *, late: bool = False, now_ms: int | None = None) -> bool:
        """The job's message is (or is about to be) in the broker; True if this call took the job
        out of the outbox (False: someone else did). ``late``: sent by the sweeper from the outbox,
        so a job still queued counts as sent now."""
        return bool(self.scripts("confirm-publish", *self._confirm_call(job_id, idem_key, late, now_ms))[1])

    def confirm_many(self, published: Sequence[tuple[str, str]]) -> None:
        """``confirm_published`` of each (job id, idempotency key) of one tenant, in one round trip."""
        self.scripts.many("confirm-publish", [self._confirm_call(job_id, key, False, None) for job_id, key in published])

    def _confirm_call(self, job_id: str, idem_key: str, late: bool, now_ms: int | None) -> Call:
        t = JobKeys(job_id).tenant
        windows, first = t.idempotency_windows(now_ms, self.idem_ttl_s)
        return ([t.outbox, t.idempotency(idem_key), t.queued, *windows],
                [job_id, at(now_ms), "1" if late else "", idem_key, first, self.idem_ttl_s])


def admission_of(reply: list[Any], tenant: str) -> Admission:
    """The admission script's reply, typed; the refusals that are errors raised."""
    code = Code(reply[0])
    if code is Code.INPUT_UNKNOWN:
        raise InputUnknown(tuple(reply[1:]))
    if code is Code.UNKNOWN_TENANT:
        raise UnknownTenant(tenant)
    if code is Code.NOT_FOUND:
        raise InvalidRequest("supersedes", "no such job")
    if code is Code.INSUFFICIENT_ALLOWANCE:
        return Admission(code, "", available=reply[1], ceiling=reply[2])
    if code is Code.REPLAYED:
        return Admission(code, reply[1], status=reply[2])
    if code is Code.LIMITED:
        raise OverLimit(reply[1], int(reply[2]) / 1000)
    if code is Code.INFEASIBLE:
        raise DeadlineInfeasible(int(reply[1]) / 1000, int(reply[2]) / 1000)
    if code is Code.CREATED:
        return Admission(code, reply[1], created_ms=int(reply[2]))
    return Admission(code, reply[1] if len(reply) > 1 else "")  # UNSUPPORTED: no job
