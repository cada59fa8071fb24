"""What a claim hands a worker: the fencing generation of one attempt, and what the attempt needs.

Ground: the state layer returns these, the processes hold them, and errors carry them, so they
live below all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Inputs:
    """What an attempt needs, read by its claim in the same step."""

    outputs_requested: int
    priority: str
    #: The job's deadline on Redis's clock (ms).
    deadline_ms: int
    #: The workflow, decoded.
    workflow: Any
    #: Indices of the outputs stored by earlier attempts (they are not asked for again).
    stored: frozenset[int]
    #: Seconds the attempt may execute at its server (0: no bound): ``max_seconds``, set at admission.
    max_seconds: int = 0


@dataclass(frozen=True)
class Claim:
    """What a worker holds while it runs one attempt of a job (or reconciles it)."""

    job_id: str
    generation: int
    attempt: int
    operation_id: str
    #: Redis's clock when the claim was made (ms): the worker measures time from here.
    claimed_ms: int = 0
    #: The fleet server the attempt runs on (its slot is taken by the claim).
    server: str = ""
    #: What the attempt needs, when the claim is an attempt's (``Store.claim``).
    inputs: Inputs | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Reconcile:
    """A reconciler's claim plus what it needs to ask the provider."""

    claim: Claim
    submitted: bool
    epoch: str
    #: When the job began reconciling, on Redis's clock (ms).
    since_ms: int = 0
    #: When the unknown attempt was marked as submitted, on Redis's clock (ms; 0: never).
    submitted_ms: int = 0
    #: Reconcile claims of this reconciliation so far, this one included.
    claims: int = 1


@dataclass(frozen=True)
class Collect:
    """A collector's claim plus what it decides with: a cancel to pass on, the deadline, the epoch."""

    claim: Claim
    cancel_requested: bool
    deadline_ms: int
    #: The provider epoch seen just before submission ('' when the provider shows none).
    epoch: str
    #: Whether the claim booked the prompt's cost (``collect_claim``'s ``charge``), so no charge step follows.
    charged: bool = False
