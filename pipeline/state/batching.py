"""Admitting a batch: each item as a job posted alone under its own key (``item_key``), every
admission in one round trip, then the created jobs' messages published and confirmed in one more.

An item admitted but not published (the broker did not answer, or the process died first) is in
its tenant's outbox, as a job posted alone would be: the sweeper publishes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from pipeline import faultpoints
from pipeline.errors import (
    DeadlineInfeasible,
    IdempotencyKeyReused,
    InsufficientAllowance,
    InvalidRequest,
    OverLimit,
)
from pipeline.state.batches import item_key
from pipeline.state.scripts import Code, ReplicationTimeout
from pipeline.state.submit import Admitter, Prepared, Submitted

log = logging.getLogger(__name__)

#: What refuses one item and is kept in the batch's record (a retry replays it). Anything else an item
#: meets (a replication timeout, a request in progress, Redis not answering) fails the whole request,
#: before its record is written: its retry admits the items again.
REFUSALS = (InvalidRequest, OverLimit, DeadlineInfeasible, InsufficientAllowance, IdempotencyKeyReused)


@dataclass(frozen=True)
class Outcome:
    """One item: its job's first response, or the refusal that stopped it."""

    submitted: Submitted | None = None
    refused: Exception | None = None


class BatchAdmitter:
    def __init__(self, admitter: Admitter) -> None:
        self.admitter, self.store = admitter, admitter.store

    def admit(self, tenant: str, batch_key: str, bodies: Sequence[Any]) -> list[Outcome]:
        """Each body admitted as a job under ``item_key(batch_key, index)``; raises what fails the batch."""
        prepared: list[Prepared | Exception] = []
        for index, body in enumerate(bodies):
            try:
                prepared.append(self.admitter.prepare(tenant, item_key(batch_key, index), body))
            except REFUSALS as refused:
                prepared.append(refused)
        ready = [(index, item) for index, item in enumerate(prepared) if isinstance(item, Prepared)]
        calls = [self.store.admit_call(tenant, item_key(batch_key, index), item.job_id, **item.admit)
                 for index, item in ready]
        admitted = dict(zip((index for index, _ in ready), self.store.admit_many(tenant, calls)))
        outcomes, created, failure = [], [], None
        for index, item in enumerate(prepared):
            if isinstance(item, Exception):
                outcomes.append(Outcome(refused=item))
                continue
            admission = admitted[index]
            if isinstance(admission, ReplicationTimeout) and admission.reply \
                    and Code(admission.reply[0]) is Code.CREATED:
                created.append((item, index))  # published, so that the retry replays it at once
            try:
                if isinstance(admission, Exception):
                    raise admission
                outcome = self.admitter.conclude(item, admission)
            except REFUSALS as refused:
                outcomes.append(Outcome(refused=refused))
                continue
            except Exception as whole:  # noqa: BLE001 (raised once the created jobs are published)
                failure = failure or whole
                continue
            outcomes.append(Outcome(submitted=outcome))
            if not outcome.replayed:
                created.append((item, index))
        faultpoints.reached("batch_after_admit")
        self._publish(batch_key, created)
        if failure is not None:
            raise failure
        return outcomes

    def _publish(self, batch_key: str, created: list[tuple[Prepared, int]]) -> None:
        """The created jobs' messages (in one round trip when the publisher sends many at once), then their
        outbox entries cleared in one more; what was not sent stays in the outbox for the sweeper."""
        jobs = [(item.job_id, item.priority) for item, _ in created]
        many = getattr(self.admitter.publish, "many", None)
        sent = []
        try:
            if many is not None:
                many(jobs)
                sent = created
            else:
                for item, index in created:
                    self.admitter.publish(item.job_id, item.priority)
                    sent.append((item, index))
        except Exception:  # admitted and in the outbox: the sweeper publishes them
            log.warning("%d of %d jobs published; the rest left to the sweeper", len(sent), len(jobs), exc_info=True)
        try:
            self.store.confirm_many([(item.job_id, item_key(batch_key, index)) for item, index in sent])
        except Exception:  # sent but still in the outbox: the sweeper sends them again, a claim takes each once
            log.warning("%d jobs published; their outbox entries left to the sweeper", len(sent), exc_info=True)
