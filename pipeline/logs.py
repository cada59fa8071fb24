"""Logs: one compact JSON object per line, from every reckon process.

Each line carries ``ts`` (UTC, ms), ``level``, ``process`` (web, worker, sweeper, watcher, sim, cli),
``pid``, ``logger``, ``msg``, ``exc`` (a traceback, when there is one) and, when the record has them,
the fields of :data:`FIELDS`. Nothing else of a record reaches a line: an ``extra`` outside that list
could carry a workflow, an output location or a key, so it is dropped.

``configure(process)`` installs the format on the root logger of a process; gunicorn takes
:class:`JsonFormatter` and :class:`AccessFormatter` through ``logconfig_dict`` (ops/gunicorn.conf.py).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import orjson

#: The ``extra`` fields a line may carry; state changes (logger ``reckon.state``) use the first seven.
FIELDS = ("job", "attempt", "generation", "from", "to", "reason", "error_class", "provider", "tenant",
          "class", "count", "endpoint", "webhook_id", "outcome")
PROCESSES = ("web", "streams", "worker", "sweeper", "watcher", "webhooks", "sim", "cli")
#: An output's URL is an output location, which stays out of logs: the access log names its route.
OUTPUT_PATH, OUTPUT_ROUTE = re.compile(r"/v1/jobs/[^/]*/outputs(/.*)?"), "/v1/jobs/{job_id}/outputs/{index}"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line (a traceback is a string field, its newlines escaped)."""

    def __init__(self, process: str) -> None:
        if process not in PROCESSES:
            raise ValueError(f"unknown process {process!r}")
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps(self.fields(record), default=str).decode()

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname, "process": self.process, "pid": record.process,
            "logger": record.name, "msg": self.message(record),
        }
        line.update((name, record.__dict__[name]) for name in FIELDS if name in record.__dict__)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return line

    def message(self, record: logging.LogRecord) -> str:
        try:
            return record.getMessage()
        except Exception:  # a bad format string still gives a line, never logging's plain-text error report
            return f"{record.msg!s} (unformattable arguments)"


class AccessFormatter(JsonFormatter):
    """gunicorn's access log: method, path, status and duration of a request, nothing else of it.

    gunicorn passes every atom of the request as the record's arguments (headers, Authorization among
    them, and the query string); this takes four and ignores ``access_log_format``. The path is
    ``PATH_INFO``, which holds no query string; an output's path is logged as its route.
    """

    def message(self, record: logging.LogRecord) -> str:
        method, path, status = _request(record)
        return f"{method} {path} {status}"

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        method, path, status = _request(record)
        micros = record.args.get("D") if isinstance(record.args, Mapping) else None
        return super().fields(record) | {
            "method": method, "path": path, "status": int(status) if status.isdigit() else status,
            "duration_ms": round(micros / 1000, 3) if isinstance(micros, int) else None}


def configure(process: str, level: int = logging.INFO) -> None:
    """Make the root logger write JSON lines to stderr, through exactly one handler.

    Handlers already there are removed (Dramatiq's CLI installs its own format before it imports
    ``pipeline.work.actors``); warnings and uncaught exceptions (main thread and others) become records.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _utc(created: float) -> str:
    """ISO 8601 in UTC with milliseconds: 2025-01-31T12:00:00.123Z."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _request(record: logging.LogRecord) -> tuple[str, str, str]:
    """Method, path and status from gunicorn's access atoms (``m``, ``U``, ``s``)."""
    atoms = record.args if isinstance(record.args, Mapping) else {}
    path = str(atoms.get("U", "-"))
    return str(atoms.get("m", "-")), OUTPUT_ROUTE if OUTPUT_PATH.fullmatch(path) else path, str(atoms.get("s", "-"))


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("reckon").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread else "?"
    logging.getLogger("reckon").critical("uncaught exception in thread %s", name,
                                         exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
