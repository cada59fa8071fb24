"""Adjustments: signed amounts booked against a job (or one attempt) after the fact, each under an id
booked once for as long as its job is kept (lua/adjust.lua; purged with the job, lua/purge.lua; docs/costs.md
"Adjustments"). The mixin ``Store`` inherits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.errors import BookingRefused, JobNotFound
from pipeline.state.controls import Controls
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import Code

#: The longest booking id and reason an adjustment takes (characters).
MAX_ID, MAX_REASON = 200, 500
#: The beginnings of the ids a charge and a hold's resolution are booked under (pipeline/state/booked.py):
#: an adjustment under one would be a second booking under one id in the usage records.
RESERVED = ("charge:", "uncertain:")


@dataclass(frozen=True)
class Adjustment:
    """What an adjustment booked: ``replayed`` when its id had booked it before (nothing changed)."""

    booking_id: str
    job_id: str
    attempt: int
    units: int
    at: int
    replayed: bool


class Bookings(Controls):
    """Books adjustments and reads them back."""

    def adjust(self, job_id: str, units: int, booking_id: str, reason: str, *, attempt: int = 0,
               now_ms: int | None = None) -> Adjustment:
        """Book ``units`` (signed: a charge, or a credit) against the job under ``booking_id``, once.

        Raises ``JobNotFound`` (no such job, or attempt), ``BookingRefused`` (the id booked something
        else, or a credit past what the job was booked), ``ValueError`` (a bad id, reason or amount)."""
        if not booking_id or len(booking_id) > MAX_ID or not booking_id.isprintable():
            raise ValueError(f"a booking id is 1 to {MAX_ID} printable characters")
        if booking_id.startswith(RESERVED):
            raise ValueError("ids beginning charge: and uncertain: are the ids of charges and holds, not adjustments")
        if len(reason) > MAX_REASON or not reason.isprintable():
            raise ValueError(f"a reason is at most {MAX_REASON} printable characters")
        if type(units) is not int or units == 0 or abs(units) >= 2**53 or attempt < 0:
            raise ValueError("units must be a non-zero integer, attempt a number from 0")
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts("adjust", [j.record, t.ledger, t.bookings, t.booking_log, *j.shard.globals],
                             ["" if now_ms is None else now_ms, booking_id, units, attempt, reason], durable=True)
        code = Code(reply[0])
        if code in (Code.OK, Code.REPLAYED):
            return Adjustment(booking_id, job_id, attempt, int(reply[1]), int(reply[2]), code is Code.REPLAYED)
        if code is Code.NOT_FOUND:
            raise JobNotFound(f"no such {reply[1]}")
        if code is Code.FINGERPRINT_MISMATCH:
            raise BookingRefused(f"booking id {booking_id!r} already booked {reply[3]} units against job "
                                 f"{reply[1]} attempt {reply[2]}; nothing changed")
        raise BookingRefused(f"a credit of {-units} units is more than the {reply[1]} the job was booked; nothing changed")

    def bookings(self, tenant: str, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
        """The tenant's adjustments booked in [start_ms, end_ms], newest first: booking id, job, attempt,
        units, reason, at."""
        t = TenantKeys(tenant)
        ids = self.redis.zrevrangebyscore(t.booking_log, end_ms, start_ms)
        if not ids:
            return []
        raws = self.redis.hmget(t.bookings, ids)
        entries = [(i, orjson.loads(raw)) for i, raw in zip(ids, raws, strict=True) if raw]
        return [{"booking_id": i, **e} for i, e in entries if "kind" not in e]  # kind: a replayed run's (replay.lua)
