"""The ``reckon`` commands for money after the fact: ``cost adjust`` (an adjustment, once per id),
``usage export`` (a tenant's usage records) and ``invoice reconcile`` (a provider's statement against the
books) (docs/costs.md)."""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import BookingRefused, JobNotFound
from pipeline.operate import invoice
from pipeline.operate.commands import _print
from pipeline.state import records
from pipeline.state.jobs import iso
from pipeline.state.store import Store
from pipeline.state.tenants import _require

#: Past any time reckon books (ms): the end of an open window.
FOREVER = 2**53


def add_parsers(verbs: Any) -> None:
    cost = verbs.add_parser("cost").add_subparsers(dest="verb", required=True)
    adjust = cost.add_parser("adjust", help="book a signed amount against a job (or one attempt) under an id, once")
    adjust.add_argument("job")
    adjust.add_argument("--units", type=int, required=True, help="cost units: positive a charge, negative a credit")
    adjust.add_argument("--id", required=True, dest="booking_id", help="the booking id: the same id books once")
    adjust.add_argument("--reason", required=True)
    adjust.add_argument("--attempt", type=int, default=0, help="the attempt it is for (default: the job)")
    adjust.set_defaults(run=cost_adjust)
    usage = verbs.add_parser("usage").add_subparsers(dest="verb", required=True)
    export = usage.add_parser("export", help="a tenant's usage records, one row per booking, newest first")
    export.add_argument("tenant")
    _window(export)
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.set_defaults(run=usage_export)
    bill = verbs.add_parser("invoice").add_subparsers(dest="verb", required=True)
    reconcile = bill.add_parser("reconcile", help="a provider's statement (CSV: operation_id, units) against the "
                                                  "books: exit 0 equal, 1 differences, 2 a malformed file")
    reconcile.add_argument("file", type=Path)
    reconcile.add_argument("--server", help="only attempts that ran on this server")
    _window(reconcile)
    reconcile.add_argument("--apply", action="store_true", help="book each difference as an adjustment")
    reconcile.set_defaults(run=invoice_reconcile)


def _window(sub: Any) -> None:
    sub.add_argument("--from", dest="start", type=_moment, default=0, help="RFC 3339, like 2026-11-01T00:00:00Z")
    sub.add_argument("--to", dest="end", type=_moment, default=FOREVER, help="RFC 3339 (default: no end)")


def _moment(text: str) -> int:
    try:
        when = datetime.fromisoformat(text.upper())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no offset (Z or +hh:mm)")
    return max(0, int(when.timestamp() * 1000))


def cost_adjust(store: Store, args: argparse.Namespace) -> int:
    try:
        done = store.adjust(args.job, args.units, args.booking_id, args.reason, attempt=args.attempt)
    except (BookingRefused, ValueError) as exc:
        print(f"reckon: {exc}", file=sys.stderr)
        return 1
    _print({"booking_id": done.booking_id, "job": done.job_id, "attempt": done.attempt or None,
            "units": done.units, "at": iso(done.at), "replayed": done.replayed})
    return 0


def usage_export(store: Store, args: argparse.Namespace) -> int:
    _require(store.redis, args.tenant)
    rows = records.every(store.redis, args.tenant, start_ms=args.start, end_ms=args.end)
    if args.format == "jsonl":
        for row in rows:
            sys.stdout.write(orjson.dumps({**row, "at": iso(row["at"])}).decode() + "\n")
        return 0
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(records.COLUMNS)
    for row in rows:
        writer.writerow(["" if row[c] is None else (iso(row[c]) if c == "at" else row[c]) for c in records.COLUMNS])
    return 0


def invoice_reconcile(store: Store, args: argparse.Namespace) -> int:
    try:
        lines, duplicates = invoice.read_statement(args.file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, invoice.Malformed) as exc:
        print(f"reckon: {args.file}: {exc}", file=sys.stderr)
        return 2
    report = invoice.compare(lines, duplicates,
                             invoice.books(store.redis, start_ms=args.start, end_ms=args.end, server=args.server))
    if args.apply:
        for job, attempt, booking_id, units, reason in invoice.corrections(report):
            correction = {"booking_id": booking_id, "job": job, "attempt": attempt, "units": units}
            try:
                done = store.adjust(job, units, booking_id, reason, attempt=attempt or 0)
            except (BookingRefused, JobNotFound) as exc:  # its id booked another amount, or the job is gone
                report.refused.append({**correction, "why": str(exc)})
                continue
            report.booked.append({**correction, "replayed": done.replayed})
    _print({"lines": len(lines), "unknown": report.unknown, "missing": report.missing, "differ": report.differ,
            "duplicate": report.duplicate, "booked": report.booked, "refused": report.refused})
    return 0 if report.clean() else 1
