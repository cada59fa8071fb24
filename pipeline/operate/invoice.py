"""A provider's statement against reckon's books: every line matched to an attempt by the provider's
operation id (the prompt id), every difference listed, and, asked, each booked as an adjustment whose id
is derived from the statement line, so a second run books nothing more (docs/costs.md "Reconciling a
statement").

The statement is CSV with a header naming at least ``operation_id`` and ``units`` (an integer); other
columns are ignored. The books are the usage records (pipeline/state/records.py) of every tenant in the
window, by operation id: an attempt's charge, its hold booked as charged, and the adjustments booked
against that attempt.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson

from pipeline.state import keys, records


#: A line's units: ASCII digits, below 2**53 (what an adjustment can book; int() would also take "1_5",
#: other scripts' digits and a sign, and a credit past a booking, or 2**53, stopped --apply halfway).
UNITS, MAX_UNITS = r"[0-9]{1,16}", 2**53 - 1


class Malformed(ValueError):
    """The statement cannot be read: one message naming the line and what is wrong with it."""


@dataclass
class Booked:
    """What reckon booked for one provider operation."""

    job: str
    attempt: int
    server: str | None
    units: int = 0


@dataclass
class Report:
    """Every difference between a statement and the books; empty lists: they agree to the unit."""

    unknown: list[dict[str, Any]] = field(default_factory=list)  # a line with no attempt
    missing: list[dict[str, Any]] = field(default_factory=list)  # an attempt with no line
    differ: list[dict[str, Any]] = field(default_factory=list)  # both, other units
    duplicate: list[dict[str, Any]] = field(default_factory=list)  # an operation id on more than one line
    booked: list[dict[str, Any]] = field(default_factory=list)  # adjustments --apply booked
    refused: list[dict[str, Any]] = field(default_factory=list)  # corrections --apply could not book

    def clean(self) -> bool:
        return not (self.unknown or self.missing or self.differ or self.duplicate)


def read_statement(text: str) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Operation id -> units, and the operation ids on more than one line -> their line numbers."""
    reader = csv.DictReader(io.StringIO(text))
    names = [n.strip() for n in reader.fieldnames or ()]
    if not {"operation_id", "units"} <= set(names):
        raise Malformed("line 1: the header must name operation_id and units")
    for name in ("operation_id", "units"):
        if names.count(name) > 1:
            raise Malformed(f"line 1: the header names {name} twice")
    lines: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    for row in reader:
        number = reader.line_num
        row = {(k or "").strip(): v for k, v in row.items()}
        op, units = (row.get("operation_id") or "").strip(), (row.get("units") or "").strip()
        if not op:
            raise Malformed(f"line {number}: no operation_id")
        if not re.fullmatch(UNITS, units) or int(units) > MAX_UNITS:
            raise Malformed(f"line {number}: units {units[:40]!r} is not an integer from 0 to 2**53 - 1")
        value = int(units)
        seen.setdefault(op, []).append(number)
        lines[op] = lines.get(op, 0) + value
    return lines, {op: numbers for op, numbers in seen.items() if len(numbers) > 1}


def books(redis: Any, *, start_ms: int, end_ms: int, server: str | None) -> dict[str, Booked]:
    """Operation id -> what was booked for it: each attempt settled in the window (on ``server``), with
    every adjustment booked against that attempt, whenever it was booked (a late one included)."""
    found: dict[str, Booked] = {}
    for tenant in [t for shard in keys.shards() for t in sorted(redis.smembers(shard.tenants))]:
        attempts: dict[tuple[str, int], Booked] = {}
        for row in records.every(redis, tenant, start_ms=start_ms, end_ms=end_ms):
            op = row["operation_id"]
            if row["kind"] == "adjustment" or not op or (server is not None and row["server"] != server):
                continue
            entry = found.setdefault(op, Booked(row["job"], row["attempt"], row["server"]))
            entry.units += row["units"]
            attempts[(row["job"], row["attempt"])] = entry
        log = keys.TenantKeys(tenant)
        ids = redis.zrange(log.booking_log, 0, -1) if attempts else []
        for raw in redis.hmget(log.bookings, ids) if ids else []:
            adjustment = orjson.loads(raw) if raw else {}
            if adjustment.get("kind"):  # a replayed run's charge or hold (lua/replay.lua): a row above already
                continue
            entry = attempts.get((adjustment.get("job"), adjustment.get("attempt")))
            if entry is not None:
                entry.units += adjustment["units"]
    return found


def compare(lines: dict[str, int], duplicates: dict[str, list[int]], booked: dict[str, Booked]) -> Report:
    report = Report()
    for op, numbers in sorted(duplicates.items()):
        report.duplicate.append({"operation_id": op, "lines": numbers})
    for op, units in sorted(lines.items()):
        if op in duplicates:
            continue
        entry = booked.get(op)
        if entry is None:
            report.unknown.append({"operation_id": op, "units": units})
        elif entry.units != units:
            report.differ.append({"operation_id": op, "job": entry.job, "attempt": entry.attempt,
                                  "server": entry.server, "booked": entry.units, "statement": units})
    for op, entry in sorted(booked.items()):
        if op not in lines and entry.units != 0:
            report.missing.append({"operation_id": op, "job": entry.job, "attempt": entry.attempt,
                                   "server": entry.server, "booked": entry.units})
    return report


def corrections(report: Report) -> Iterable[tuple[str, int, str, int, str]]:
    """(job, attempt, booking id, units, reason) of each difference an adjustment can settle: an amount that
    differs, or an attempt the statement does not bill (credited). A line with no attempt and a duplicate
    line are for an operator: nothing to book them against, or no telling which line is right."""
    for d in report.differ:
        yield (d["job"], d["attempt"], f"statement:{d['operation_id']}:{d['statement']}",
               d["statement"] - d["booked"], f"statement bills {d['statement']}, booked {d['booked']}")
    for m in report.missing:
        yield (m["job"], m["attempt"], f"statement:{m['operation_id']}:absent", -m["booked"],
               f"statement does not bill it, booked {m['booked']}")
