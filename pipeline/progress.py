"""Progress events: a provider's progress messages become job events, each recorded once.

``lua/progress-3.lua`` records a point only for the job's running attempt and only when its
value is new for that node (so a replayed or reconnected websocket adds nothing), with a seq
from the counter the job's state events use. State events stay in their own list, all kept;
progress keeps the newest ``keep`` points. Readers merge the two lists by seq.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from . import archive
from .keys import JobKeys
from .scripts import Code, Scripts, raise_for

#: Progress points kept per job, the newest (state events are all kept).
DEFAULT_KEEP = 50
#: States in which a job makes no more events (unless a dead letter is replayed).
TERMINAL = frozenset({"completed", "failed", "cancelled"})


def record(
    scripts: Scripts, job_id: str, attempt: int, operation_id: str, node: str, value: float, max_value: float,
    *, keep: int = DEFAULT_KEEP, now_ms: int | None = None,
) -> bool:
    """Record one progress message of ``attempt`` (whose provider operation is ``operation_id``);
    True if it became an event, False if it was dropped: the job is not running that attempt and
    operation, the node already reported this value or a higher one, or a number is not finite."""
    if not all(_finite(n) for n in (value, max_value)):
        return False
    j = JobKeys(job_id)
    reply = scripts("progress", [j.record, j.progress, j.progress_seen],
                    [attempt, operation_id, node, value, max_value, keep, "" if now_ms is None else now_ms])
    code = Code(reply[0])
    if code not in (Code.CREATED, Code.OK):
        raise_for(code, reply)
    return code is Code.CREATED


def snapshot(redis_client: Any, job_id: str, after_seq: int) -> tuple[str | None, list[dict[str, Any]]]:
    """The job's state (None if there is no such job) and its events with seq above ``after_seq``,
    state and progress merged in seq order, read in one MULTI: apart, a state event written
    between the two list reads could be skipped by a reader that resumes after a later progress seq."""
    j = JobKeys(job_id)
    pipe = redis_client.pipeline(transaction=True)
    pipe.hmget(j.record, "state", archive.FIELD)
    pipe.lrange(j.events, 0, -1)
    pipe.lrange(j.progress, 0, -1)
    (state, packed), states, points = pipe.execute()
    events = [{**event, "type": "state"} for event in archive.events(states, packed)]
    events += [orjson.loads(raw) for raw in points]
    return state, sorted((e for e in events if e["seq"] > after_seq), key=lambda e: e["seq"])


def events_after(redis_client: Any, job_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
    """The job's events (state and progress) with seq above ``after_seq``, in order."""
    return snapshot(redis_client, job_id, after_seq)[1]


def _finite(number: Any) -> bool:
    return isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number)
