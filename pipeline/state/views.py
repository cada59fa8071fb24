"""Reads for the jobs clients see: only the record fields ``job_view`` shows, never the workflow.

A job record carries its workflow (up to ``RECKON_MAX_WORKFLOW_BYTES``); HGETALL would move it
over the wire for every job in a listing only to drop it. HMGET of the view's fields does not.
"""

from __future__ import annotations

from typing import Any

from pipeline.state import archive
from pipeline.state.keys import JobKeys

#: Every record field ``pipeline.state.jobs.job_view`` reads (a test keeps the two in step).
VIEW_FIELDS = (
    "id", "state", "kind", "priority", "outputs_requested", "attempt_count", "attempts_not_sent",
    "price", "ceiling", "reserved", "charged", "uncertain", "settled",
    "cancel_requested", "obsolete", "external_effect",
    "deadline", "created_at", "updated_at", "error_class", "error_reason", "error_detail", "inputs",
    "charges", "adjusted", "adjustments",
)


def job_record(client: Any, job_id: str) -> dict[str, str] | None:
    """The view fields of one job's record, or None if there is no such job."""
    reply = client.hmget(JobKeys(job_id).record, archive.hmget_fields(VIEW_FIELDS))
    return _record(archive.values(job_id, VIEW_FIELDS, reply))


def jobs_with_outputs(client: Any, job_ids: list[str]) -> list[tuple[dict[str, str], dict[int, dict[str, Any]]]]:
    """(view fields, outputs) of each existing job, in order, in one pipelined round trip (not one step:
    each job's outputs are read before its record, whose packed value has them all once it is packed)."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:  # outputs first: a job packed between the two reads is found packed
        pipe.hgetall(JobKeys(job_id).outputs)
        pipe.hmget(JobKeys(job_id).record, archive.hmget_fields(VIEW_FIELDS))
    replies = pipe.execute()
    rows = ((_record(archive.values(job_id, VIEW_FIELDS, reply)), archive.outputs(live, reply[-1]))
            for job_id, live, reply in zip(job_ids, replies[::2], replies[1::2], strict=True))
    return [(record, outputs) for record, outputs in rows if record is not None]


def _record(values: list[str | None]) -> dict[str, str] | None:
    record = {name: value for name, value in zip(VIEW_FIELDS, values, strict=True) if value is not None}
    return record if "id" in record else None

