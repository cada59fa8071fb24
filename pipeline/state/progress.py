"""Progress events: a provider's progress messages become job events, each recorded once.

``lua/progress.lua`` records a point only for the job's running attempt and only when its
value is new for that node (so a replayed or reconnected websocket adds nothing), with a seq
from the counter the job's state events use. State events stay in their own list, all kept;
progress keeps the newest ``keep`` points. Readers merge the two lists by seq.

A watcher does not record every message: its ``Coalescer`` writes at most one point per job per
interval, the newest and highest (docs/api.md "Progress events").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.settings import DEFAULT_PROGRESS_INTERVAL_SECONDS
from pipeline.state import archive
from pipeline.state.keys import JobKeys
from pipeline.state.scripts import Code, Scripts, raise_for

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
    reply = scripts("progress", [j.record, j.progress],
                    [attempt, operation_id, node, value, max_value, keep, "" if now_ms is None else now_ms])
    code = Code(reply[0])
    if code not in (Code.CREATED, Code.OK):
        raise_for(code, reply)
    return code is Code.CREATED


def snapshot(redis_client: Any, job_id: str, after_seq: int) -> tuple[str | None, list[dict[str, Any]]]:
    """The job's state (None if there is no such job) and its events with seq above ``after_seq``,
    state and progress merged in seq order, read in one MULTI: apart, a state event written
    between the two list reads could be skipped by a reader that resumes after a later progress seq."""
    return _merged(_queue_snapshot(redis_client.pipeline(transaction=True), job_id).execute(), after_seq)


async def snapshot_async(redis_client: Any, job_id: str, after_seq: int) -> tuple[str | None, list[dict[str, Any]]]:
    """``snapshot`` over an asynchronous client (``redis.asyncio``: the streams process, api/streams/)."""
    return _merged(await _queue_snapshot(redis_client.pipeline(transaction=True), job_id).execute(), after_seq)


def _queue_snapshot(pipe: Any, job_id: str) -> Any:
    j = JobKeys(job_id)
    pipe.hmget(j.record, "state", archive.FIELD)
    pipe.lrange(j.events, 0, -1)
    pipe.lrange(j.progress, 0, -1)
    return pipe


def _merged(replies: list[Any], after_seq: int) -> tuple[str | None, list[dict[str, Any]]]:
    (state, packed), states, points = replies
    events = [{**event, "type": "state"} for event in archive.events(states, packed)]
    events += [orjson.loads(raw) for raw in points]
    return state, sorted((e for e in events if e["seq"] > after_seq), key=lambda e: e["seq"])


def events_after(redis_client: Any, job_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
    """The job's events (state and progress) with seq above ``after_seq``, in order."""
    return snapshot(redis_client, job_id, after_seq)[1]


#: Records one progress point (job id, attempt, operation id, node, value, max); True if it became an event.
Record = Callable[[str, int, str, str, float, float], bool]


@dataclass
class _Job:
    """One watched job's progress as its watcher holds it, for one attempt and operation."""

    attempt: int
    operation_id: str
    written_at: float | None  # when a point of the job was last written (clock seconds); None: never
    highest: dict[str, float] = field(default_factory=dict)  # node -> highest value taken in this attempt
    pending: tuple[str, float, float] | None = None  # (node, value, max): the point not yet written


class Coalescer:
    """At most one progress write per job per ``interval`` seconds; the highest value wins.

    A point above what its node reached before (in the same attempt and operation) becomes the
    job's pending point, replacing the one there. It is written at once if the job's last write is
    ``interval`` old or there was none (a client sees the job start moving), else by a later
    ``offer`` or ``flush`` once it is. A point of another attempt or operation replaces the job's
    marks and its pending point, as the script's marks are replaced. ``drop`` forgets a pending
    point when the prompt ends: the completion the client sees next says more. One watcher thread
    owns a coalescer, so nothing here is locked.
    """

    def __init__(self, record: Record, interval: float = DEFAULT_PROGRESS_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record, self.interval, self.clock = record, interval, clock
        self.jobs: dict[str, _Job] = {}

    def offer(self, job_id: str, attempt: int, operation_id: str, node: str, value: float,
              max_value: float) -> None:
        """Take one progress message; written now if the job's interval has passed."""
        if not (_finite(value) and _finite(max_value)):
            return
        job = self.jobs.get(job_id)
        if job is None or (job.attempt, job.operation_id) != (attempt, operation_id):
            job = self.jobs[job_id] = _Job(attempt, operation_id, job.written_at if job else None)
        if node in job.highest and value <= job.highest[node]:
            return  # replayed, or below what the node reached: the script would drop it
        job.highest[node] = value
        job.pending = (node, value, max_value)
        self._write_if_due(job_id, job, self.clock())

    def flush(self) -> None:
        """Write each pending point whose job's interval has passed."""
        now = self.clock()
        for job_id, job in list(self.jobs.items()):
            self._write_if_due(job_id, job, now)

    def drop(self, job_id: str) -> None:
        """The job's prompt ended (or goes to a worker): its pending point is not written."""
        if job_id in self.jobs:
            self.jobs[job_id].pending = None

    def keep_only(self, job_ids: Container[str]) -> None:
        """Forget the jobs not in ``job_ids`` (no longer watched here)."""
        for job_id in [j for j in self.jobs if j not in job_ids]:
            del self.jobs[job_id]

    def _write_if_due(self, job_id: str, job: _Job, now: float) -> None:
        if job.pending is None or (job.written_at is not None and now - job.written_at < self.interval):
            return
        (node, value, max_value), job.pending, job.written_at = job.pending, None, now
        self.record(job_id, job.attempt, job.operation_id, node, value, max_value)


def _finite(number: Any) -> bool:
    return isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number)
