"""Logs are one JSON object per line: the formatter field by field, configure() in a process of its
own, and plain Dramatiq's workers (every process of a real stack: tests/faults/test_json_logs.py)."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dramatiq
import orjson
import pytest
from gunicorn.glogging import SafeAtoms

from pipeline.logs import AccessFormatter, JsonFormatter
from tests.conftest import wait_until
from tests.faults.conftest import BIN, ROOT

CREATED = 1_700_000_000.1239  # 2023-11-14T22:13:20.123Z
CANARY = "canary-6f1d2a"


def lines_of(logger_name: str, formatter: logging.Formatter, emit: Any) -> list[dict[str, Any]]:
    """Records ``emit(logger)`` makes on a logger of its own (the root logger is left alone), as parsed lines."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.Logger(logger_name)
    logger.addHandler(handler)
    emit(logger)
    text = out.getvalue()
    assert text.endswith("\n")
    return [orjson.loads(line) for line in text.splitlines()]


def test_a_record_has_exactly_the_base_fields() -> None:
    record = logging.makeLogRecord({"name": "pipeline.work.sweeper", "levelno": logging.WARNING, "levelname": "WARNING",
                                    "msg": "sweep: %s", "args": ({"queued": 2},), "created": CREATED,
                                    "msecs": 123.9, "process": 4242})
    assert orjson.loads(JsonFormatter("sweeper").format(record)) == {
        "ts": "2023-11-14T22:13:20.123Z", "level": "WARNING", "process": "sweeper", "pid": 4242,
        "logger": "pipeline.work.sweeper", "msg": "sweep: {'queued': 2}"}


def test_a_state_change_carries_its_fields_from_and_to_included() -> None:
    extra = {"job": "j-1", "attempt": 2, "generation": 7, "from": "running", "to": "retry_wait",
             "reason": "provider_error", "error_class": "transient"}
    [line] = lines_of("reckon.state", JsonFormatter("worker"), lambda log: log.info("state change", extra=extra))
    assert set(line) == {"ts", "level", "process", "pid", "logger", "msg", *extra}
    assert {k: line[k] for k in ("level", "process", "pid", "logger", "msg")} == {
        "level": "INFO", "process": "worker", "pid": os.getpid(), "logger": "reckon.state", "msg": "state change"}
    assert {k: line[k] for k in extra} == extra


def test_an_exception_is_one_line_with_its_traceback() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("collect failed for %s", "j-9", extra={"job": "j-9", "count": 3})

    [line] = lines_of("pipeline.work.executor", JsonFormatter("worker"), emit)
    assert set(line) == {"ts", "level", "process", "pid", "logger", "msg", "job", "count", "exc"}
    assert (line["level"], line["msg"], line["job"], line["count"]) == ("ERROR", "collect failed for j-9", "j-9", 3)
    assert line["exc"].startswith("Traceback (most recent call last):\n")
    assert line["exc"].endswith('raise ValueError("boom")\nValueError: boom')


def test_an_extra_outside_the_allow_list_is_dropped() -> None:
    extra = {"workflow": {"3": {"inputs": {"text": CANARY}}}, "api_key": CANARY, "location": CANARY,
             "tenant": "acme", "provider": "comfyui", "class": "batch"}
    [line] = lines_of("pipeline.state.jobs", JsonFormatter("web"), lambda log: log.info("admitted", extra=extra))
    assert set(line) == {"ts", "level", "process", "pid", "logger", "msg", "tenant", "provider", "class"}
    assert (line["tenant"], line["provider"], line["class"]) == ("acme", "comfyui", "batch")
    assert CANARY not in orjson.dumps(line).decode()


def test_a_message_that_cannot_be_formatted_still_makes_a_line() -> None:
    [line] = lines_of("x", JsonFormatter("cli"), lambda log: log.info("%d of %d", "one"))
    assert line["msg"] == "%d of %d (unformattable arguments)"


def test_an_unknown_process_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown process 'api'"):
        JsonFormatter("api")


def test_an_access_line_has_method_path_status_and_duration_only() -> None:
    """gunicorn's atoms (as glogging.Logger.access passes them) hold the query string and every header."""
    atoms = SafeAtoms({
        "h": "127.0.0.1", "r": f"GET /v1/jobs/j-1?token={CANARY} HTTP/1.1", "s": "200", "m": "GET",
        "U": "/v1/jobs/j-1", "q": f"token={CANARY}", "a": CANARY, "D": 12_345, "M": 12,
        "{authorization}i": f"Bearer {CANARY}", "{x-trace}i": CANARY, "{location}o": CANARY})
    fmt = '%(h)s "%(r)s" %(s)s "%({authorization}i)s" %(q)s'  # whatever access_log_format says
    [line] = lines_of("gunicorn.access", AccessFormatter("web"), lambda log: log.info(fmt, atoms))
    assert {k: v for k, v in line.items() if k not in ("ts", "pid")} == {
        "level": "INFO", "process": "web", "logger": "gunicorn.access", "msg": "GET /v1/jobs/j-1 200",
        "method": "GET", "path": "/v1/jobs/j-1", "status": 200, "duration_ms": 12.345}


def test_an_output_download_is_logged_by_its_route() -> None:
    atoms = SafeAtoms({"m": "GET", "U": "/v1/jobs/acme.1f2e/outputs/1", "s": "200", "D": 900})
    [line] = lines_of("gunicorn.access", AccessFormatter("web"), lambda log: log.info("%(U)s", atoms))
    assert (line["msg"], line["path"], line["duration_ms"]) == (
        "GET /v1/jobs/{job_id}/outputs/{index} 200", "/v1/jobs/{job_id}/outputs/{index}", 0.9)
    assert "acme.1f2e" not in orjson.dumps(line).decode()


def test_configure_replaces_the_handlers_already_there_and_routes_warnings_and_crashes() -> None:
    """As under Dramatiq's CLI: a plain format is on the root logger before ``configure`` runs."""
    script = textwrap.dedent("""
        import logging, sys, threading, warnings
        logging.basicConfig(level=logging.DEBUG, format="[%(asctime)s] [PID %(process)d] %(message)s")
        logging.getLogger().addHandler(logging.StreamHandler(sys.stdout))
        from pipeline.logs import configure
        configure("cli")
        assert len(logging.getLogger().handlers) == 1
        logging.getLogger("dramatiq.WorkerProcess(0)").info("Worker process is ready for action.")
        logging.getLogger("quiet").debug("below the level")
        warnings.warn("old API", DeprecationWarning)
        thread = threading.Thread(target=lambda: 1 / 0, name="t-1")
        thread.start(); thread.join()
        raise RuntimeError("crash")
    """)
    done = subprocess.run([sys.executable, "-W", "always", "-c", script], cwd=ROOT, capture_output=True,
                          timeout=30)
    assert done.returncode == 1 and done.stdout == b""
    lines = [orjson.loads(line) for line in done.stderr.splitlines()]
    assert [(x["level"], x["process"], x["logger"], x["msg"].splitlines()[0]) for x in lines] == [
        ("INFO", "cli", "dramatiq.WorkerProcess(0)", "Worker process is ready for action."),
        ("WARNING", "cli", "py.warnings", "<string>:10: DeprecationWarning: old API"),
        ("CRITICAL", "cli", "reckon", "uncaught exception in thread t-1"),
        ("CRITICAL", "cli", "reckon", "uncaught exception"),
    ]
    assert lines[2]["exc"].endswith("ZeroDivisionError: division by zero")
    assert lines[3]["exc"].endswith("RuntimeError: crash")


def test_plain_dramatiq_logs_json_from_its_workers(redis_client, tmp_path: Path) -> None:
    """``dramatiq pipeline.work.actors`` (no wrapper): importing the actors replaces the CLI's format in each
    worker process; its main process, which never imports them, keeps the CLI's plain lines (which is
    why the Procfiles run ``python -m pipeline.work.worker``)."""
    log = tmp_path / "dramatiq.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "dramatiq"), "pipeline.work.actors", "--processes", "1", "--threads", "1"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: b"Worker process is ready" in log.read_bytes(), timeout=30)
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # the main process stops its worker, then exits
        proc.wait(timeout=30)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of its group still there
        except ProcessLookupError:
            pass
    lines = log.read_text().splitlines()
    plain = [line for line in lines if not line.startswith("{")]
    assert [line.split("] ")[-1] for line in plain] == [
        f"Dramatiq {dramatiq.__version__!r} is booting up.", "Sending signal 'SIGTERM' to subprocesses..."]
    workers = [orjson.loads(line) for line in lines if line.startswith("{")]
    assert [(x["process"], x["msg"]) for x in workers] == [
        ("worker", "Worker process is ready for action."), ("worker", "Stopping worker process..."),
        ("worker", "Shutting down..."), ("worker", "Worker has been shut down.")]
