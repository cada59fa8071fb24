"""What happened lately, for the operators' status page (``GET /ui``).

Queue samples: queue depth and oldest queued age per class, one sample per ``RESOLUTION_S``
slot, kept in the hash ``reckon:history``. The field is the slot number modulo ``SLOTS``, so the
hash never holds more than ``SLOTS`` fields (an hour at 30 s) and a new hour overwrites the old
one; each value carries its own ``at`` (the slot's start, ms on Redis's clock), so two sweepers
writing the same slot write the same ``at`` and a reader can drop what is older than the window.
The sweeper records one sample per slot (``record``: one HGET per pass, a snapshot and one HSET
per slot).

Recent problems: the newest dead letters and needs_review jobs over every tenant, with only
identifiers (job id, class, error class, reason, when): never a workflow or an output location.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Mapping

import orjson

from pipeline.state import archive, keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.status import CLASSES

#: Seconds between two samples; the slot of a time is ``at // RESOLUTION_S``.
RESOLUTION_S = 30
#: Fields of the history hash: an hour of samples.
SLOTS = 120
#: Samples older than this are not shown (a slot not overwritten for an hour holds one).
WINDOW_S = RESOLUTION_S * SLOTS
#: Rows of each recent-problems list.
RECENT_LIMIT = 20
#: Tenants read per pipelined round trip while looking for the newest problems.
TENANTS_PER_ROUND_TRIP = 500
#: The record fields a recent-problem row shows (``error_detail`` may quote provider text: never read).
RECENT_FIELDS = ("priority", "error_class", "error_reason", "updated_at")

Sample = dict[str, Any]


def slot_start(now_ms: int) -> int:
    """The start (ms) of the slot that holds ``now_ms``."""
    step = RESOLUTION_S * 1000
    return now_ms // step * step


def field(at_ms: int) -> str:
    return str(at_ms // (RESOLUTION_S * 1000) % SLOTS)


def due(client: Any, now_ms: int) -> bool:
    """True when the slot of ``now_ms`` has no sample of its own yet (empty, or an hour old)."""
    raw = client.hget(keys.HISTORY, field(now_ms))
    return raw is None or orjson.loads(raw).get("at") != slot_start(now_ms)


def put(client: Any, figures: Mapping[str, Mapping[str, float]], now_ms: int) -> Sample:
    """Write the sample of ``now_ms``'s slot: ``figures`` is class -> {depth, oldest_age_s}."""
    sample: Sample = {"at": slot_start(now_ms)}
    for cls in CLASSES:
        sample[cls] = {"depth": int(figures[cls]["depth"]), "oldest_age_s": float(figures[cls]["oldest_age_s"])}
    client.hset(keys.HISTORY, field(now_ms), orjson.dumps(sample))
    return sample


def record(client: Any, now_ms: int, snapshot: Callable[[], Mapping[str, Any]]) -> bool:
    """The sweeper's step: sample the queues (``snapshot()``, pipeline.state.status's figures) when
    this slot has no sample yet. True when it wrote one."""
    if not due(client, now_ms):
        return False
    put(client, snapshot()["classes"], now_ms)
    return True


def read(client: Any, now_ms: int) -> list[Sample]:
    """The samples of the last ``WINDOW_S`` before ``now_ms``, oldest first."""
    since = now_ms - WINDOW_S * 1000
    samples = [orjson.loads(raw) for raw in client.hvals(keys.HISTORY)]
    return sorted((s for s in samples if since < s["at"] <= now_ms), key=lambda s: s["at"])


def recent(client: Any, tenants: list[str], index: str, limit: int = RECENT_LIMIT) -> list[dict[str, Any]]:
    """The newest ``limit`` jobs of a per-tenant index (``dead`` or ``review``) over all tenants,
    newest first (the index's score: when the job failed, or when its review expires), as rows
    {id, class, error_class, reason, at (ms)}."""
    newest: list[tuple[float, str]] = []
    for start in range(0, len(tenants), TENANTS_PER_ROUND_TRIP):
        pipe = client.pipeline(transaction=False)
        for tenant in tenants[start:start + TENANTS_PER_ROUND_TRIP]:
            pipe.zrevrange(getattr(TenantKeys(tenant), index), 0, limit - 1, withscores=True)
        for rows in pipe.execute():
            newest = heapq.nlargest(limit, [*newest, *((score, job_id) for job_id, score in rows)])
    pipe = client.pipeline(transaction=False)
    for _, job_id in newest:
        pipe.hmget(JobKeys(job_id).record, archive.hmget_fields(RECENT_FIELDS))
    rows = []
    for (_, job_id), reply in zip(newest, pipe.execute(), strict=True):
        cls, error_class, reason, at = archive.values(job_id, RECENT_FIELDS, reply)
        rows.append({"id": job_id, "class": cls, "error_class": error_class or "", "reason": reason or "",
                     "at": int(at) if at else None})
    return rows
