"""Job requests: validation, fingerprint, cost ceiling, admission, and the job's public view."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import orjson

from pipeline.errors import InvalidRequest
from pipeline.settings import Settings
from pipeline.state import booked, ids

log = logging.getLogger(__name__)

KINDS = frozenset({"image"})
PRIORITIES = ("interactive", "batch")
MAX_OUTPUTS = 16
MAX_DEADLINE_SECONDS = 24 * 3600
MAX_COST = 2**53
#: Nesting limit of a whole request body (the API refuses deeper bodies before anything else;
#: orjson itself encodes at most 254 levels).
MAX_DEPTH = 64
_FIELDS = frozenset({"kind", "workflow", "outputs", "max_cost", "deadline_s", "priority", "supersedes",
                     "max_seconds"})
#: Fields validated as integers: 2.0 is read as 2 (JSON Schema agrees), and so is fingerprinted.
_INTEGER_FIELDS = ("outputs", "max_cost", "deadline_s", "max_seconds")


class State(str, Enum):
    """Job states; see the state machine in docs/design.md. The last three are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    RECONCILING = "reconciling"
    NEEDS_REVIEW = "needs_review"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class JobRequest:
    kind: str
    workflow: dict[str, Any]
    outputs: int
    max_cost: int | None
    deadline_s: int
    priority: str
    supersedes: str | None = None
    #: Seconds one attempt may execute at its server (interrupted past them); None: the class's default.
    max_seconds: int | None = None
    #: The workflow as encoded once, for the size check: what is stored and sent.
    workflow_json: bytes = b""


def parse_request(body: Any, settings: Settings) -> JobRequest:
    """Validate a decoded request body; InvalidRequest names the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequest("body", "the request body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidRequest(unknown[0], "unknown field")
    kind = _choice(body, "kind", tuple(sorted(KINDS)), required=True)
    workflow = body.get("workflow")
    if not isinstance(workflow, dict) or not workflow:
        raise InvalidRequest("workflow", "must be a non-empty JSON object")
    try:
        encoded = orjson.dumps(workflow)
    except orjson.JSONEncodeError:  # deeper than orjson encodes; the API refuses MAX_DEPTH earlier
        raise InvalidRequest("workflow", f"must nest at most {MAX_DEPTH - 1} levels") from None
    if len(encoded) > settings.max_workflow_bytes:
        raise InvalidRequest("workflow", f"must encode to at most {settings.max_workflow_bytes} bytes")
    return JobRequest(
        kind=kind,
        workflow=workflow,
        outputs=_integer(body, "outputs", 1, MAX_OUTPUTS, None),
        max_cost=_integer(body, "max_cost", 1, MAX_COST, None) if "max_cost" in body else None,
        deadline_s=_integer(body, "deadline_s", 1, MAX_DEADLINE_SECONDS, settings.default_deadline_seconds),
        priority=_choice(body, "priority", PRIORITIES),
        supersedes=_job_id(body, "supersedes"),
        max_seconds=_integer(body, "max_seconds", 1, MAX_DEADLINE_SECONDS, None) if "max_seconds" in body else None,
        workflow_json=encoded,
    )


def _job_id(body: dict[str, Any], field: str) -> str | None:
    if field not in body:
        return None
    value = body[field]
    if not isinstance(value, str) or not ids.JOB_ID_RE.fullmatch(value):
        raise InvalidRequest(field, "must be a job id")
    return value


def _integer(body: dict[str, Any], field: str, low: int, high: int, default: int | None) -> int:
    value = body.get(field, default)
    if isinstance(value, float) and value.is_integer():  # JSON Schema counts 16.0 as an integer
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(field, f"must be an integer from {low} to {high}")
    return value


def _choice(body: dict[str, Any], field: str, choices: tuple[str, ...], *, required: bool = False) -> str:
    """One of ``choices`` (the first when absent, unless required); a string is checked before any
    lookup, so an object or array is a 422 like any other wrong value."""
    value = body.get(field) if required else body.get(field, choices[0])
    if not isinstance(value, str) or value not in choices:
        raise InvalidRequest(field, f"must be one of: {', '.join(choices)}")
    return value


def fingerprint(body: Any) -> str:
    """sha256 of the canonical body: sorted keys, no white space, integral floats in the integer
    fields written as integers (``2.0`` is the request ``2``, as validation reads it). The workflow
    is hashed as decoded: ``5`` and ``5.0`` there are different provider inputs."""
    if isinstance(body, dict):
        floats = {f: int(v) for f in _INTEGER_FIELDS if isinstance(v := body.get(f), float) and v.is_integer()}
        body = body | floats if floats else body
    try:
        encoded = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # nested deeper than orjson encodes (the API refuses MAX_DEPTH first)
        raise InvalidRequest("workflow", f"must nest at most {MAX_DEPTH - 1} levels") from None
    return hashlib.sha256(encoded).hexdigest()


def cost_plan(request: JobRequest, settings: Settings, price: int, *,
              per_attempt: int | None = None) -> tuple[int, int, int]:
    """(price of one attempt, attempts covered, ceiling) for a request, at ``price`` per output
    (``fleet.highest_price``: the dearest server the job may run on), or at ``per_attempt`` when
    given (``fleet.attempt_ceiling``: outputs and ``max_seconds`` at the dearest server).

    The ceiling pays for every permitted attempt; a client ``max_cost`` lowers
    it, and then only as many attempts as it covers are allowed.
    """
    per_attempt = request.outputs * price if per_attempt is None else per_attempt
    ceiling = per_attempt * settings.max_attempts
    if request.max_cost is not None:
        if request.max_cost < per_attempt:
            raise InvalidRequest(
                "max_cost", f"must cover at least one attempt ({per_attempt} cost units)",
                problem="max-cost-too-low",
            )
        ceiling = min(ceiling, request.max_cost)
    return per_attempt, ceiling // per_attempt, ceiling


#: The fields of a job that never change after admission: enough to rebuild its first response.
ADMISSION_FIELDS = ("id", "kind", "priority", "outputs_requested", "price", "ceiling", "deadline_s", "created_at")


def first_response(record: dict[str, Any]) -> bytes:
    """The 202 body of the job's admission, from fields that never change: the same bytes
    however often, and whenever, it is rebuilt (the idempotency record stores no body)."""
    admitted = {name: record[name] for name in ADMISSION_FIELDS} | {"inputs": record.get("inputs", "")}
    created = int(admitted["created_at"])
    admitted |= {"state": State.QUEUED.value, "attempt_count": 0, "reserved": admitted["ceiling"], "charged": 0,
                 "uncertain": 0, "settled": 0, "updated_at": created,
                 "deadline": created + int(admitted["deadline_s"]) * 1000}
    return orjson.dumps(job_view(admitted, {}))


def iso(ms: int | str | None) -> str | None:
    if ms in (None, ""):
        return None
    moment = datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_view(record: dict[str, Any], outputs: dict[int, dict[str, Any]],
             attempts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The job as clients see it: never the workflow, never provider text. ``attempts`` (its attempt
    records, when the caller read them) add each charged attempt's ``seconds``, when it has them."""
    job_id = record["id"]
    error_class = record.get("error_class") or None
    view: dict[str, Any] = {
        "id": job_id,
        "state": record["state"],
        "kind": record["kind"],
        "priority": record["priority"],
        "outputs_requested": int(record["outputs_requested"]),
        "outputs": [
            {"index": index, **output, "href": f"/v1/jobs/{job_id}/outputs/{index}"}
            for index, output in sorted(outputs.items())
        ],
        # submissions only: an attempt that sent nothing (not_sent) is listed but not counted
        "attempt_count": int(record["attempt_count"]) - int(record.get("attempts_not_sent", 0)),
        "cost": {
            "price": int(record["price"]),
            "ceiling": int(record["ceiling"]),
            "reserved": int(record["reserved"]) + int(record.get("charged", 0)),
            "uncertain": int(record.get("uncertain", 0)),
            "settled": int(record["settled"]),
        },
        "cancel_requested": record.get("cancel_requested") == "1",
        "obsolete": record.get("obsolete") == "1",
        "external_effect": record.get("external_effect") or None,
        "deadline": iso(record["deadline"]),
        "created_at": iso(record["created_at"]),
        "updated_at": iso(record["updated_at"]),
        "error": {"class": error_class, "reason": record.get("error_reason") or None,
                  "detail": orjson.loads(record["error_detail"]) if record.get("error_detail") else None}
        if error_class else None,
    }
    _booked(view["cost"], record, attempts)
    if record.get("inputs"):  # the uploaded inputs its workflow names, by content: never a URL nor a server's path
        view["inputs"] = [{"sha256": sha256} for sha256 in record["inputs"].split(",")]
    return view


def _booked(cost: dict[str, Any], record: dict[str, Any], attempts: list[dict[str, Any]] | None) -> None:
    """Add what was booked per attempt and by adjustment to a view's cost, only when there is any (views of
    jobs without them stay as they were)."""
    seconds = {a.get("number"): booked.seconds(a) for a in attempts or () if booked.seconds(a) is not None}
    per_attempt = booked.charges(record)
    for charge in per_attempt:
        if charge["attempt"] in seconds:
            charge["seconds"] = seconds[charge["attempt"]]
    if per_attempt:
        cost["attempts"] = per_attempt
    adjustments = booked.adjustments(record)
    if adjustments:
        cost["adjusted"] = int(record.get("adjusted", 0))
        cost["adjustments"] = [{"id": a["id"], "attempt": a["attempt"] or None, "units": a["units"],
                                "reason": a["reason"], "at": iso(a["at"])} for a in adjustments]
