"""The client's one exception tree: ``ReckonError`` and a subclass per problem the API answers.

The API answers every error as RFC 9457 ``application/problem+json`` with a stable ``type``
(``urn:reckon:problem:<name>``, the table in reckon's docs/api.md "Problem types"); ``from_problem``
picks the class by that type, else by the HTTP status. Three classes are the client's own:
``DeadlineExceeded`` (its deadline passed with no answer to raise), ``IntegrityError`` (downloaded
bytes that do not match their sha256) and ``ProtocolError`` (an answer that is not what the API sends).
"""

from __future__ import annotations

from typing import Any

PROBLEM_BASE = "urn:reckon:problem:"


class ReckonError(Exception):
    """Root of everything the client raises on purpose. For an answer of the API: its HTTP
    ``status``, the problem's ``type``, ``title`` and ``detail``, the whole ``problem`` dict
    (extension members such as ``field``, ``available``, ``missing_models``), and
    ``retry_after`` (seconds) when the answer had a ``Retry-After``."""

    #: Whether the same request may succeed later unchanged (the client retries it, same key).
    retryable = False

    def __init__(self, message: str | None = None, *, status: int | None = None,
                 problem: dict[str, Any] | None = None, retry_after: float | None = None) -> None:
        self.problem: dict[str, Any] = dict(problem or {})
        self.status = status
        self.type: str | None = self.problem.get("type")
        self.title: str | None = self.problem.get("title")
        self.detail: str | None = self.problem.get("detail")
        self.retry_after = retry_after
        super().__init__(message or _describe(status, self.type, self.title, self.detail))

    @property
    def name(self) -> str | None:
        """The problem's name: its type without ``urn:reckon:problem:`` (``invalid-job``)."""
        return self.type[len(PROBLEM_BASE):] if self.type and self.type.startswith(PROBLEM_BASE) else self.type


def _describe(status: int | None, type_: str | None, title: str | None, detail: str | None) -> str:
    head = " ".join(str(part) for part in (status, type_) if part)
    return f"{head}: {detail or title or 'no detail'}" if head else (detail or title or "error")


# The client's own.
class DeadlineExceeded(ReckonError, TimeoutError):
    """The call's deadline passed (timeouts or refused connections only, or ``wait`` before the job
    ended); ``__cause__`` is the last failure. A submission may have been admitted: the same intent
    submitted again finds it."""


class IntegrityError(ReckonError):
    """Downloaded bytes whose sha256 is not the one the job view lists; nothing was left at the destination."""

    def __init__(self, message: str, *, expected: str, actual: str) -> None:
        super().__init__(message)
        self.expected, self.actual = expected, actual


class ProtocolError(ReckonError):
    """An answer the API does not give (a body that is not JSON, an event stream cut off for good)."""


# Refusals of the request as sent: it must change before it can succeed.
class InvalidRequest(ReckonError):
    """400, 413, 415 and 422: the request is refused as it is (``problem['field']`` names the member)."""


class MaxCostTooLow(InvalidRequest):
    """422 ``max-cost-too-low``: ``max_cost`` is below one attempt at the fleet's highest price."""


class DeadlineInfeasible(InvalidRequest):
    """422 ``deadline-infeasible``: the job cannot finish before its ``deadline_s``."""


class UnsupportedWorkflow(InvalidRequest):
    """422 ``unsupported-workflow``: no server has the node classes and models the workflow names."""


class IdempotencyKeyReused(InvalidRequest):
    """422 ``idempotency-key-reused``: the intent was submitted before with a different body."""


class InputUnknown(InvalidRequest):
    """422 ``input-unknown`` or ``input-not-allowed``: the workflow names a file the tenant has not uploaded
    (``problem['names']``)."""


class Unauthorized(ReckonError):
    """401 ``unauthorized``: an unknown or revoked API key, or a key of a disabled tenant."""


class InsufficientAllowance(ReckonError):
    """402 ``insufficient-allowance``: the tenant's available units do not cover the job's ceiling."""


class NotFound(ReckonError):
    """404: no such route, job or output."""


class JobNotFound(NotFound):
    """404 ``job-not-found``: no such job, another tenant's job, or one purged past its retention."""


class BatchNotFound(NotFound):
    """404 ``batch-not-found``: no such batch of the tenant (another tenant's too)."""


class OutputNotFound(NotFound):
    """404 ``output-not-found``: no output stored at that index."""


class InputNotFound(NotFound):
    """404 ``input-not-found``: the tenant has no input of that sha256."""


class Conflict(ReckonError):
    """409: the request does not apply in the job's (or the key's) state."""


class RequestInProgress(Conflict):
    """409 ``idempotency-request-in-progress``: the first request of this intent is still being admitted."""

    retryable = True


class JobFinished(Conflict):
    """409 ``job-finished``: a cancel of a completed or failed job."""


class InputInUse(Conflict):
    """409 ``input-in-use``: unfinished jobs name the input (``problem['jobs']``); delete it once they end."""


class InputQuotaExceeded(ReckonError):
    """507 ``input-quota-exceeded``: the tenant's inputs would hold more bytes than its quota."""


class OutputMissing(ReckonError):
    """410 ``output-missing``: the output was stored but its bytes are gone."""


class OverLimit(ReckonError):
    """429 and 503: the API cannot take the request now; raised once retrying it passed the deadline."""

    retryable = True


class RateLimited(OverLimit):
    """429 ``rate-limited`` or ``too-many-in-flight``: over the tenant's limits."""


class Unavailable(OverLimit):
    """503 (``queue-full``, ``load-shed``, ``state-unavailable``, ``replication-timeout``,
    ``output-unavailable``, ``too-many-streams``), and a gateway's 502 or 504."""


class ServerError(ReckonError):
    """500 ``internal-error`` and any other answer the client has no class for."""


_BY_NAME: dict[str, type[ReckonError]] = {
    "max-cost-too-low": MaxCostTooLow,
    "deadline-infeasible": DeadlineInfeasible,
    "unsupported-workflow": UnsupportedWorkflow,
    "idempotency-key-reused": IdempotencyKeyReused,
    "unauthorized": Unauthorized,
    "insufficient-allowance": InsufficientAllowance,
    "job-not-found": JobNotFound,
    "batch-not-found": BatchNotFound,
    "output-not-found": OutputNotFound,
    "idempotency-request-in-progress": RequestInProgress,
    "job-finished": JobFinished,
    "output-missing": OutputMissing,
    "input-unknown": InputUnknown,
    "input-not-allowed": InputUnknown,
    "input-not-found": InputNotFound,
    "input-in-use": InputInUse,
}

_BY_STATUS: dict[int, type[ReckonError]] = {
    400: InvalidRequest, 401: Unauthorized, 402: InsufficientAllowance, 404: NotFound, 405: InvalidRequest,
    409: Conflict, 410: OutputMissing, 413: InvalidRequest, 415: InvalidRequest, 422: InvalidRequest,
    429: RateLimited, 502: Unavailable, 503: Unavailable, 504: Unavailable, 507: InputQuotaExceeded,
}


def from_problem(status: int, problem: dict[str, Any], retry_after: float | None = None) -> ReckonError:
    """The typed exception of one error answer: by the problem's type, else by its status."""
    type_ = problem.get("type")
    name = type_[len(PROBLEM_BASE):] if isinstance(type_, str) and type_.startswith(PROBLEM_BASE) else None
    cls = _BY_NAME.get(name or "") or _BY_STATUS.get(status) or ServerError
    return cls(status=status, problem=problem, retry_after=retry_after)
