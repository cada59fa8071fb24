"""reckon's Python client: ``Client`` and the exceptions it raises (reckon's docs/client.md).

``client`` holds the calls (jobs, their events and outputs, uploaded inputs), ``errors`` the exception tree (one class per problem type of the API),
``retry`` the waits between tries, ``sse`` the event stream's parser and ``transport`` one HTTP
exchange over the standard library. Imports nothing but the standard library, and nothing of the
server's packages: it installs on its own (``pip install ./client``).
"""

from __future__ import annotations

from reckon.client.client import Client, batch_key, idempotency_key
from reckon.client.errors import (
    BatchNotFound,
    Conflict,
    DeadlineExceeded,
    DeadlineInfeasible,
    IdempotencyKeyReused,
    InputInUse,
    InputNotFound,
    InputQuotaExceeded,
    InputUnknown,
    InsufficientAllowance,
    IntegrityError,
    InvalidRequest,
    JobFinished,
    JobNotFound,
    MaxCostTooLow,
    NotFound,
    OutputMissing,
    OutputNotFound,
    OverLimit,
    ProtocolError,
    RateLimited,
    ReckonError,
    RequestInProgress,
    ServerError,
    Unauthorized,
    Unavailable,
    UnsupportedWorkflow,
)
from reckon.client.retry import Backoff

__all__ = [
    "Backoff", "BatchNotFound", "Client", "Conflict", "DeadlineExceeded", "DeadlineInfeasible", "IdempotencyKeyReused",
    "InputInUse", "InputNotFound", "InputQuotaExceeded", "InputUnknown", "InsufficientAllowance", "IntegrityError",
    "InvalidRequest", "JobFinished", "JobNotFound", "MaxCostTooLow",
    "NotFound", "OutputMissing", "OutputNotFound", "OverLimit", "ProtocolError", "RateLimited", "ReckonError",
    "RequestInProgress", "ServerError", "Unauthorized", "Unavailable", "UnsupportedWorkflow", "batch_key", "idempotency_key",
]
