"""One job as an operator looks it up (the job page, ``GET /ui/jobs/<id>.json``), in one bounded read.

What an operator needs to decide what to do next: the tenant, the state, the cost buckets, the
attempts (server, worker, operation id, error class), the state events and progress points in seq
order, what the job's index says comes next (a lease's expiry, a retry's due time, a
reconciliation's next ask, a review's expiry) and whether a queued job waits parked for a slot.

Only named fields are read and shown, so nothing is shown by accident: never the workflow (its
own key, not read), never an output's sha256 (the name of its blob in the store), never the
error's detail (it may quote the provider), never the idempotency key. A field added to the
record later stays hidden until it is named here.

Cost: one round trip, a MULTI of ``COMMANDS`` reads (HMGET of the record, HGETALL of the attempts
and of the outputs, LRANGE of the state events and of the progress points (the newest
``progress.DEFAULT_KEEP``), one ZSCORE in each of ``NEXT``'s indexes and in the shard's parked set),
whatever the number of tenants or jobs. All its keys share the job's hash tag.
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.state import archive
from pipeline.state.jobs import iso
from pipeline.state.ids import tenant_of
from pipeline.state.keys import JobKeys

#: The record fields shown, as the record keeps them.
FIELDS = (
    "id", "state", "kind", "priority", "outputs_requested", "attempt_count", "attempts_not_sent",
    "attempts_allowed", "price", "per_attempt", "ceiling", "reserved", "charged", "uncertain", "settled",
    "supersedes", "cancel_requested", "obsolete", "external_effect", "deadline", "created_at", "updated_at",
    "settled_at", "error_class", "error_reason", "lease_expires",
)
#: The cost buckets (cost units): ``price`` per output, ``per_attempt``, the ``ceiling`` reserved at
#: admission, then where it is now (docs/costs.md).
COST = ("price", "per_attempt", "ceiling", "reserved", "charged", "uncertain", "settled")
#: The attempt fields shown (an attempt's record holds no others: lua/claim.lua).
ATTEMPT = ("number", "state", "server", "provider", "worker", "generation", "price", "operation_id",
           "started_at", "submitted_at", "ended_at", "error_class")
#: State -> (the tenant's index it sits in, what that index's score says of the job). A running job's
#: lease expiry is its record's (``lease_expires``): the leases index may keep an earlier time, when
#: the sweeper looks again (``renew`` in lua/_lib.lua).
NEXT = {
    "retry_wait": ("retry", "runs_again"),
    "reconciling": ("reconcile", "next_check"),
    "needs_review": ("review", "review_expires"),
}
#: Redis commands of one look-up besides MULTI and EXEC (a test pins them).
COMMANDS = 5 + len(NEXT) + 1


def job(client: Any, job_id: str) -> dict[str, Any] | None:
    """The job as an operator sees it, or None if there is no such job (ValueError: not a job id)."""
    j, tenant = JobKeys(job_id), tenant_of(job_id)
    pipe = client.pipeline(transaction=True)  # one moment: the events agree with the state, live or packed
    pipe.hgetall(j.attempts)
    pipe.lrange(j.events, 0, -1)
    pipe.hgetall(j.outputs)
    pipe.lrange(j.progress, 0, -1)
    for index, _ in NEXT.values():
        pipe.zscore(getattr(j.tenant, index), job_id)
    pipe.zscore(j.shard.parked, job_id)
    pipe.hmget(j.record, archive.hmget_fields(FIELDS))
    attempts, events, outputs, points, *scores, parked, reply = pipe.execute()
    record = {name: value for name, value in zip(FIELDS, archive.values(job_id, FIELDS, reply), strict=True)
              if value is not None}
    if "id" not in record:
        return None
    packed = reply[-1]
    due = dict(zip(NEXT, scores, strict=True))
    return {
        "id": job_id,
        "tenant": tenant,
        **_job(record),
        "next": _next(record, due),
        "parked": parked is not None,
        "cost": {name: int(record.get(name) or 0) for name in COST},
        "outputs": [{"index": index, "bytes": output.get("bytes"), "content_type": output.get("content_type")}
                    for index, output in sorted(archive.outputs(outputs, packed).items())],
        "attempts": [_attempt(attempt) for attempt in archive.attempts(attempts, packed)],
        "events": timeline(archive.events(events, packed), [orjson.loads(raw) for raw in points]),
    }


def _job(record: dict[str, str]) -> dict[str, Any]:
    error_class = record.get("error_class") or None
    return {
        "state": record["state"],
        "kind": record.get("kind"),
        "priority": record.get("priority"),
        "outputs_requested": int(record.get("outputs_requested") or 0),
        # submissions only, as clients count them: an attempt that sent nothing is listed, not counted
        "attempt_count": int(record.get("attempt_count") or 0) - int(record.get("attempts_not_sent") or 0),
        "attempts_listed": int(record.get("attempt_count") or 0),
        "attempts_allowed": int(record.get("attempts_allowed") or 0),
        "cancel_requested": record.get("cancel_requested") == "1",
        "obsolete": record.get("obsolete") == "1",
        "external_effect": record.get("external_effect") or None,
        "supersedes": record.get("supersedes") or None,
        "deadline": iso(record.get("deadline")),
        "created_at": iso(record.get("created_at")),
        "updated_at": iso(record.get("updated_at")),
        "settled_at": iso(record.get("settled_at")),
        "error": {"class": error_class, "reason": record.get("error_reason") or None} if error_class else None,
    }


def _next(record: dict[str, str], due: dict[str, float | None]) -> dict[str, Any] | None:
    """What comes next for the job, and when; None for a state that waits for nothing timed."""
    state = record["state"]
    if state == "running" and int(record.get("lease_expires") or 0):
        return {"what": "lease_expires", "at": iso(record["lease_expires"])}
    if state not in NEXT or due[state] is None:
        return None
    return {"what": NEXT[state][1], "at": iso(int(due[state] or 0))}


def _attempt(attempt: dict[str, Any]) -> dict[str, Any]:
    shown = {name: attempt.get(name) for name in ATTEMPT}
    for name in ("started_at", "submitted_at", "ended_at"):
        shown[name] = iso(shown[name]) if shown[name] else None  # 0: not submitted
    return shown


def timeline(events: list[dict[str, Any]], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """State events and progress points in seq order (they share the job's counter)."""
    rows = [{"seq": e.get("seq"), "type": "state", "at": iso(e.get("at")), "from": e.get("from") or None,
             "to": e.get("to"), "reason": e.get("reason") or None} for e in events]
    rows += [{"seq": p.get("seq"), "type": "progress", "at": iso(p.get("at")), "attempt": p.get("attempt"),
              "node": p.get("node"), "value": p.get("value"), "max": p.get("max")} for p in points]
    return sorted(rows, key=lambda row: row["seq"] or 0)
