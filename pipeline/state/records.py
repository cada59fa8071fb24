"""Usage records: one row per booking of a tenant (an attempt's charge, an uncertain hold resolved, an
adjustment), newest first, derived from what is stored already, so no job step writes a row.

An attempt's charge and the resolution of its hold (``charges`` and ``holds``) are on the job's
record (pipeline/state/booked.py) and become final when the job ends: their time is the job's
settlement, its score in the tenant's done index, and they are kept while the job is
(``RECKON_RETENTION_SECONDS``, then purged with it). Adjustments come from the tenant's booking log
(lua/adjust.lua), kept as long as their job (lua/purge.lua removes them with it), and so do the charges and
holds of a run a dead-letter replay sent again (lua/replay.lua logs them there at the time they settled,
with their ``kind``; kept as long as the tenant). A page reads up to ``limit`` jobs and adjustments from
the two indexes (and every other one at the lowest time it reached, so no row is skipped between pages)
and the records and attempts of those jobs, in two round trips.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import orjson

from pipeline.state import archive, booked
from pipeline.state.keys import JobKeys, TenantKeys

#: The columns of a row, in order (the CSV export's header).
COLUMNS = ("at", "kind", "booking_id", "job", "attempt", "server", "operation_id", "seconds", "units", "reason")
MAX_PAGE, DEFAULT_PAGE = 500, 100


class BadCursor(ValueError):
    """A cursor this module did not write."""


#: A cursor: the last row's time (ms) and its booking id in hex (any text of this shape is a cursor); an id
#: is up to 200 characters (pipeline/state/bookings.py MAX_ID), up to 4 bytes each in UTF-8.
CURSOR_PATTERN = r"^[0-9]{1,16}\.([0-9a-f]{2}){0,800}$"


def encode_cursor(at: int, booking_id: str) -> str:
    return f"{at}.{booking_id.encode().hex()}"


def decode_cursor(text: str) -> tuple[int, str]:
    if not re.fullmatch(CURSOR_PATTERN, text):
        raise BadCursor("not a cursor of this listing")
    at, _, hexed = text.partition(".")
    return int(at), bytes.fromhex(hexed).decode(errors="replace")


def _newest(redis: Any, key: str, top: int | str, bottom: int, limit: int) -> tuple[list[tuple[str, int]], int | None]:
    """Up to ``limit`` members of ``key`` scored in [bottom, top], newest first, and every other one at the
    lowest score reached; and that score when there may be more below it (else None)."""
    rows = [(m, int(s)) for m, s in redis.zrevrangebyscore(key, top, bottom, start=0, num=limit, withscores=True)]
    if len(rows) < limit:
        return rows, None
    low = rows[-1][1]
    ties = {m for m, s in rows if s == low}
    rows += [(m, low) for m in redis.zrangebyscore(key, low, low) if m not in ties]
    return rows, low


def _jobs(redis: Any, job_ids: list[str]) -> dict[str, tuple[dict[str, str], dict[int, dict[str, Any]]]]:
    """Job id -> (record, attempts by number) of each job still kept, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(JobKeys(job_id).attempts)
        pipe.hgetall(JobKeys(job_id).record)
    replies = pipe.execute()
    found = {}
    for job_id, live, flat in zip(job_ids, replies[::2], replies[1::2], strict=True):
        if flat:
            attempts = archive.attempts(live, flat.get(archive.FIELD))
            found[job_id] = (archive.record(job_id, flat), {a.get("number"): a for a in attempts})
    return found


def _row(at: int, kind: str, booking_id: str, job_id: str, attempt: int, server: str | None,
         run: dict[str, Any] | None, units: int, reason: str | None = None) -> dict[str, Any]:
    run = run or {}
    return {"at": at, "kind": kind, "booking_id": booking_id, "job": job_id, "attempt": attempt or None,
            "server": server or run.get("server"), "operation_id": run.get("operation_id"),
            "seconds": booked.seconds(run), "units": units, "reason": reason}


def _job_rows(job_id: str, at: int, record: dict[str, str], runs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's charges and holds of the run that ended at ``at``: those of an earlier run, which a replay
    logged at the time it settled (``logged_through``, lua/replay.lua), are listed from the log."""
    through = int(record.get("logged_through") or 0)
    rows = [_row(at, "charge", booked.booking_id("charge", job_id, c["attempt"]), job_id, c["attempt"], c["server"],
                 runs.get(c["attempt"]), c["units"]) for c in booked.charges(record) if c["attempt"] > through]
    rows += [_row(at, "uncertain", booked.booking_id("uncertain", job_id, h["attempt"]), job_id, h["attempt"],
                  h["server"], runs.get(h["attempt"]), h["units"], h["outcome"])
             for h in booked.holds(record) if h["attempt"] > through]
    return rows


def page(redis: Any, tenant: str, *, start_ms: int, end_ms: int, cursor: tuple[int, str] | None = None,
         limit: int = DEFAULT_PAGE) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """Up to ``limit`` rows booked in [start_ms, end_ms], newest first (by time, then booking id), older
    than ``cursor``; and the cursor of the next page (None: no more)."""
    t = TenantKeys(tenant)
    top: int | str = min(end_ms, cursor[0]) if cursor else end_ms
    if cursor and cursor[1] == "" and cursor[0] <= end_ms:
        top = f"({cursor[0]}"  # every row at that time was given: from below it, or no page moves on
    done, done_low = _newest(redis, t.done, top, start_ms, limit)
    adjusted, adjusted_low = _newest(redis, t.booking_log, top, start_ms, limit)
    entries = dict(zip([i for i, _ in adjusted], redis.hmget(t.bookings, [i for i, _ in adjusted]))) if adjusted else {}
    adjustments = [{"booking_id": i, "at": at, **orjson.loads(entries[i])} for i, at in adjusted if entries.get(i)]
    jobs = _jobs(redis, sorted({j for j, _ in done} | {a["job"] for a in adjustments}))
    rows = [row for job_id, at in done if job_id in jobs for row in _job_rows(job_id, at, *jobs[job_id])]
    for a in adjustments:
        runs = jobs.get(a["job"], ({}, {}))[1]
        rows.append(_row(a["at"], a.get("kind", "adjustment"), a["booking_id"], a["job"], a["attempt"], a.get("server"),
                         runs.get(a["attempt"]) if a["attempt"] else None, a["units"], a.get("reason")))
    floor = max((low for low in (done_low, adjusted_low) if low is not None), default=None)
    rows = [r for r in rows if (cursor is None or (r["at"], r["booking_id"]) < cursor)
            and (floor is None or r["at"] >= floor)]
    rows.sort(key=lambda r: (r["at"], r["booking_id"]), reverse=True)
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, (rows[-1]["at"], rows[-1]["booking_id"])
    return rows, None if floor is None else (floor, "")


def every(redis: Any, tenant: str, *, start_ms: int, end_ms: int) -> Iterator[dict[str, Any]]:
    """Every row booked in [start_ms, end_ms], newest first, page by page."""
    cursor: tuple[int, str] | None = None
    while True:
        rows, cursor = page(redis, tenant, start_ms=start_ms, end_ms=end_ms, cursor=cursor, limit=MAX_PAGE)
        yield from rows
        if cursor is None:
            return
