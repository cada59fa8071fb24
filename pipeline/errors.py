"""One exception tree for everything reckon raises on purpose.

Provider errors carry an ``error_class``: the stable name that routes a failure
(terminal, retry, reconcile) and that clients see in a job's ``error.class``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.claims import Claim


class ReckonError(Exception):
    """Root of reckon's exceptions."""


class ScriptError(ReckonError):
    """A Lua script answered with a code its caller did not expect."""


class UnknownTenant(ReckonError):
    pass


class StaleLease(ReckonError):
    """This worker no longer holds the job's lease: stop writing, do nothing else."""

    error_class = "stale_lease"


class IncompleteOutputs(ReckonError):
    """Completion was asked for before every output was stored."""


class CancelRequested(ReckonError):
    """The client cancelled the job before the provider was called."""


class DispatchPaused(ReckonError):
    """The job's class or server was paused after its claim: nothing is sent, the attempt goes back."""


class SubmitUnconfirmed(ReckonError):
    """The submit mark reached the primary but no replica in time: nothing is sent (a failover that
    lost the mark would have the provider run it twice), the attempt goes back."""


class DeadlineExceeded(ReckonError):
    """Too little time is left before the job's deadline to submit an attempt."""


class NotAllowed(ReckonError):
    """An operator or client action does not apply to the job in its current state."""


class JobNotFound(NotAllowed):
    """The job is not there: it never was, or the sweeper purged it past its retention (perhaps
    between a caller's read of it and its action)."""


class ProviderError(ReckonError):
    """A provider call failed; the subclass says what is known about its effect."""

    error_class = "provider_error"

    def __init__(self, reason: str, *, retry_after: float | None = None,
                 detail: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        #: A safe summary for the job's error (node id, class type, error type, message), or None.
        self.detail = detail


class InvalidInput(ProviderError):
    """The provider refused the input itself: terminal, the request must change."""

    error_class = "invalid_input"


class PolicyRejected(ProviderError):
    """The provider refused on policy: terminal, never tried elsewhere."""

    error_class = "policy_rejected"


class ProviderAuthFailed(ProviderError):
    """Our credentials were refused: an operator problem, not the user's."""

    error_class = "provider_auth"


class RateLimited(ProviderError):
    """The provider asked us to slow down (Retry-After in ``retry_after``)."""

    error_class = "rate_limited"


class Transient(ProviderError):
    """Failed with evidence that nothing executed (nothing sent, or refused before work)."""

    error_class = "transient"


class Unreachable(Transient):
    """The server refused the connection or answered 5xx to a read: nothing was sent, and the
    server, not the job, is at fault (dispatch skips it until it answers again)."""

    error_class = "provider_unreachable"


class NotExecuted(Transient):
    """Reconciliation proved the attempt never executed (same provider epoch, no record)."""

    error_class = "not_executed"


class PossibleDuplicate(Transient):
    """The outcome was unknowable and the policy (the duplicate-cost allowance) retried it anyway,
    paying for the unknown attempt as if it ran: a possible duplicate, visible as such."""

    error_class = "possible_duplicate"


class UnknownOutcome(ProviderError):
    """The request may have been accepted: only the provider can say what happened."""

    error_class = "unknown_outcome"


class OperationFailed(ProviderError):
    """The provider ran the operation and reported that it failed."""

    error_class = "provider_failed"


class ExecutionFailed(ProviderError):
    """The provider ran the graph and it failed in a way the same graph fails again (an
    execution error, fewer outputs than requested): terminal, never paid for twice."""

    error_class = "execution_failed"


class OutputLost(ProviderError):
    """A completed run lists an output the provider can no longer serve (``/view`` 404: its output
    folder was cleaned while its history still names the file). Paid for and gone: not the client's
    input; reconcile, then an operator decides."""

    error_class = "provider_output_lost"


class OutputMalformed(ProviderError):
    """An output's bytes claim a format (PNG, WEBP, JPEG) whose structure is broken, so its metadata
    cannot be stripped with certainty; it is never stored as it is, since it may carry the workflow."""

    error_class = "provider_output_malformed"


class OutputRefused(ReckonError):
    """An output in a format whose metadata reckon cannot remove (``pipeline/providers/media.py``
    ``CLEANED``) and the operator does not allow stored as it is: never stored. The same graph saves
    the same format, so the job fails for good; the run was paid (it ran)."""

    def __init__(self, reason: str, content_type: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.content_type = content_type


class BlobMissing(ReckonError):
    """A stored output's bytes are gone from blob storage; the message names no location."""


class BlobUnreadable(ReckonError):
    """A stored output's bytes cannot be read now (an I/O error); the message names no location."""


class InputNotStaged(ReckonError):
    """An input the workflow names could not be put on the attempt's server before its prompt (the
    upload refused or its answer lost, or the input vanished from the server before the prompt):
    nothing was sent that could run, so the attempt goes back ``not_sent``, uncharged
    (pipeline/work/staging.py). Not a ProviderError: it never reaches the failure router."""

    error_class = "input_not_staged"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InputMissing(InputNotStaged):
    """An input's bytes are gone from the blob store: no attempt can run the job; it fails, uncharged."""

    error_class = "input_missing"


class InvalidRequest(ReckonError):
    """A well-formed job request that cannot be accepted as it is (HTTP 422)."""

    def __init__(self, field: str, detail: str, *, problem: str = "invalid-job") -> None:
        super().__init__(detail)
        self.field = field
        self.detail = detail
        self.problem = problem


class UnsupportedWorkflow(InvalidRequest):
    """No configured server has every node class and model file the workflow names (HTTP 422)."""

    def __init__(self, nodes: tuple[str, ...], models: tuple[str, ...]) -> None:
        named = [f"node classes {', '.join(nodes)}" if nodes else "", f"models {', '.join(models)}" if models else ""]
        super().__init__("workflow", "no server can run it: missing " + " and ".join(n for n in named if n),
                         problem="unsupported-workflow")
        self.nodes, self.models = nodes, models


class InputUnknown(InvalidRequest):
    """The workflow names files it may not (HTTP 422): ``problem`` ``input-unknown`` for names in reckon's
    form the tenant has no input under, ``input-not-allowed`` for any other file in a loader's file input."""

    def __init__(self, names: tuple[str, ...], *, problem: str = "input-unknown") -> None:
        shown = ", ".join(name[:200] for name in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        what = "no uploaded input of the tenant is named" if problem == "input-unknown" else \
            "a loader may only take an uploaded input (reckon/<sha256>.<ext>), not"
        super().__init__("workflow", f"{what} {shown}", problem=problem)
        self.names = names


class InvalidParams(InvalidRequest):
    """A saved workflow's parameters a request got wrong (HTTP 422 ``invalid-params``): each bad one by name,
    with why (unknown, missing, wrong type, out of bounds); never the values (they are prompts)."""

    def __init__(self, bad: tuple[tuple[str, str], ...]) -> None:
        shown = "; ".join(f"{name[:64]}: {reason}" for name, reason in bad[:20])
        super().__init__("params", shown + (f" and {len(bad) - 20} more" if len(bad) > 20 else ""),
                         problem="invalid-params")
        self.bad = bad


class OverQuota(ReckonError):
    """An upload would take the tenant's inputs over its quota of bytes, or their number over the most it may
    keep (HTTP 507)."""

    def __init__(self, held: int, quota: int, size: int, inputs: int = 0, max_inputs: int = 0) -> None:
        what = f"the tenant has {inputs} inputs, the most it may keep" if max_inputs and inputs >= max_inputs \
            else f"the tenant's inputs hold {held} bytes of its {quota}; this one has {size}"
        super().__init__(what)
        self.held, self.quota, self.size, self.inputs, self.max_inputs = held, quota, size, inputs, max_inputs


class InputInUse(ReckonError):
    """An input an unfinished job uses cannot be deleted (HTTP 409); ``jobs``: their ids."""

    def __init__(self, jobs: tuple[str, ...]) -> None:
        super().__init__("unfinished jobs use the input")
        self.jobs = jobs


class OverLimit(ReckonError):
    """Admission refused for load: the tenant is over one of its limits (HTTP 429: ``max_inflight``,
    ``rate``) or the fleet is (HTTP 503: ``queue_full``, ``load_shed``); ``retry_after`` in seconds."""

    TENANT_REASONS = ("max_inflight", "rate")

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"over the {'tenant' if reason in self.TENANT_REASONS else 'fleet'}'s {reason} limit")
        self.reason = reason
        self.retry_after = retry_after


class DeadlineInfeasible(ReckonError):
    """The job cannot finish before its deadline given the backlog ahead of it (HTTP 422)."""

    def __init__(self, estimate_s: float, deadline_s: float) -> None:
        super().__init__(f"estimated to finish in {estimate_s:.0f} s, after its deadline of {deadline_s:.0f} s")
        self.estimate_s = estimate_s
        self.deadline_s = deadline_s


class IdempotencyConflict(ReckonError):
    """The key's first request is still being processed (HTTP 409)."""


class IdempotencyKeyReused(ReckonError):
    """The key was used before with a different request (HTTP 422)."""


class InsufficientAllowance(ReckonError):
    """The job's cost ceiling does not fit the tenant's available allowance (HTTP 402)."""

    def __init__(self, available: int, required: int) -> None:
        super().__init__(f"requires {required} cost units, {available} available")
        self.available = available
        self.required = required


class AttemptFailed(ReckonError):
    """An attempt ended in a provider error; the routing middleware decides what comes next."""

    def __init__(self, claim: Claim, cause: ProviderError) -> None:
        super().__init__(cause.error_class)
        self.claim = claim
        self.cause = cause


class WrongShards(ReckonError):
    """This process was given another shard count (``RECKON_SHARDS``) than the one the state holds."""


class BookingRefused(ReckonError):
    """An adjustment was not booked: its id booked something else (``conflict``), or it is a credit past what
    the job was booked. Nothing changed."""
