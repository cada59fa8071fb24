"""The client's parts that need no server: keys per intent, the waits between tries, the event
stream's parser, a class for every problem type the API documents, and its imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from reckon.client import (
    Backoff,
    BatchNotFound,
    Client,
    Conflict,
    DeadlineExceeded,
    DeadlineInfeasible,
    IdempotencyKeyReused,
    InputInUse,
    InputNotFound,
    InputQuotaExceeded,
    InputUnknown,
    InsufficientAllowance,
    InvalidRequest,
    JobFinished,
    JobNotFound,
    MaxCostTooLow,
    NotFound,
    OutputMissing,
    OutputNotFound,
    RateLimited,
    RequestInProgress,
    ServerError,
    Unauthorized,
    Unavailable,
    UnsupportedWorkflow,
    idempotency_key,
)
from reckon.client.errors import PROBLEM_BASE, from_problem
from reckon.client.retry import retry_after
from reckon.client.sse import Message, messages

from api.resources import IDEMPOTENCY_KEY_RE
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_an_intent_that_is_a_valid_key_is_the_key_and_any_other_is_its_digest() -> None:
    assert idempotency_key("order-17:v2") == "order-17:v2"
    derived = idempotency_key("render «castle» for order 17")
    assert derived == idempotency_key("render «castle» for order 17") != idempotency_key("render «castle» 18")
    assert re.fullmatch(r"sha256\.[0-9a-f]{64}", derived) and IDEMPOTENCY_KEY_RE.fullmatch(derived)
    assert idempotency_key("x" * 256).startswith("sha256.") and idempotency_key("").startswith("sha256.")


def test_backoff_doubles_up_to_its_cap_with_jitter_and_stretches_a_retry_after_by_a_tenth_at_most() -> None:
    low, high = Backoff(random=lambda: 0.0), Backoff(random=lambda: 0.999999)
    assert [low.wait(tries) for tries in range(1, 8)] == [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert [round(high.wait(tries), 3) for tries in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert (low.wait(1, retry_after=2.0), round(high.wait(9, retry_after=2.0), 3)) == (2.0, 2.2)
    assert [retry_after(v) for v in ("2", " 30 ", None, "1.5", "-1", "Wed, 21 Oct 2015 07:28:00 GMT", "²")] == [
        2.0, 30.0, None, None, None, None, None]


def test_a_call_with_no_answer_tries_until_its_deadline_then_raises_deadline_exceeded() -> None:
    now, waits = [0.0], []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    client = Client(f"http://127.0.0.1:{free_port()}", "k", deadline=2.0, backoff=Backoff(random=lambda: 0.5),
                    clock=lambda: now[0], sleep=sleep)  # nothing listens: every connect is refused
    with pytest.raises(DeadlineExceeded) as exceeded:
        client.job("acme.0123456789abcdef0123")
    assert waits == [0.1875, 0.375, 0.75]  # a fourth wait (1.5 s) would end past the deadline
    assert isinstance(exceeded.value.__cause__, ConnectionRefusedError) and "4 tries" in str(exceeded.value)


def test_the_stream_parser_gives_whole_messages_only() -> None:
    stream = (b"retry: 1000\n\n: ping\n\nid: 1\nevent: state\ndata: {\"seq\": 1}\n\n"
              b"id: 2\r\ndata: a\r\ndata: b\r\n\r\nid: 3\nevent: progress\ndata: {\"seq\"")
    lines = iter(stream.splitlines(keepends=True) + [b""])
    assert list(messages(lambda: next(lines))) == [
        Message(retry=1000), Message(id="1", event="state", data='{"seq": 1}'), Message(id="2", data="a\nb")]


#: Each problem type of docs/api.md's table and the class the client raises for it.
CLASSES = {
    "idempotency-key-invalid": InvalidRequest, "malformed-json": InvalidRequest, "invalid-parameter": InvalidRequest,
    "bad-request": InvalidRequest, "not-found": NotFound, "method-not-allowed": InvalidRequest,
    "unauthorized": Unauthorized, "insufficient-allowance": InsufficientAllowance, "job-not-found": JobNotFound,
    "output-not-found": OutputNotFound, "idempotency-request-in-progress": RequestInProgress,
    "job-finished": JobFinished, "job-state-conflict": Conflict, "output-missing": OutputMissing,
    "payload-too-large": InvalidRequest, "unsupported-media-type": InvalidRequest, "invalid-job": InvalidRequest,
    "duplicate-member": InvalidRequest, "idempotency-key-reused": IdempotencyKeyReused,
    "max-cost-too-low": MaxCostTooLow, "max-seconds-required": InvalidRequest, "deadline-infeasible": DeadlineInfeasible,
    "unsupported-workflow": UnsupportedWorkflow, "too-many-in-flight": RateLimited, "rate-limited": RateLimited,
    "internal-error": ServerError, "queue-full": Unavailable, "load-shed": Unavailable,
    "state-unavailable": Unavailable, "replication-timeout": Unavailable, "output-unavailable": Unavailable,
    "too-many-streams": Unavailable, "not-ready": Unavailable,
    "input-empty": InvalidRequest, "input-incomplete": InvalidRequest, "input-too-large": InvalidRequest,
    "input-type-unsupported": InvalidRequest,
    "input-unknown": InputUnknown, "input-not-allowed": InputUnknown, "input-not-found": InputNotFound,
    "input-in-use": InputInUse, "input-unavailable": Unavailable, "input-quota-exceeded": InputQuotaExceeded,
    "invalid-params": InvalidRequest, "workflow-not-found": InvalidRequest, "invalid-workflow": InvalidRequest,
    "workflow-name-taken": Conflict, "too-many-versions": Conflict,
    "invalid-batch": InvalidRequest, "batch-not-found": BatchNotFound,
}


def documented_problems() -> list[tuple[int, str]]:
    """(status, name) of each row of docs/api.md's "Problem types" table."""
    table = (ROOT / "docs" / "api.md").read_text().split("## Problem types", 1)[1].split("\n## ", 1)[0]
    found = []
    for statuses, names in re.findall(r"^\| ([0-9 /]+) \| (`[^|]+`) \|", table, re.MULTILINE):
        codes, slugs = [int(s) for s in statuses.split(" / ")], re.findall(r"`([a-z-]+)`", names)
        found += zip(codes if len(codes) == len(slugs) else codes * len(slugs), slugs)
    return found


def test_every_documented_problem_type_has_its_class_and_only_load_and_in_progress_are_retried() -> None:
    documented = documented_problems()
    assert sorted(name for _, name in documented) == sorted(CLASSES)
    for status, name in documented:
        error = from_problem(status, {"type": PROBLEM_BASE + name, "title": "t", "status": status})
        assert (type(error), error.status, error.name) == (CLASSES[name], status, name)
        assert error.retryable == (status in (429, 503) or name == "idempotency-request-in-progress"), name
    assert type(from_problem(502, {})) is Unavailable and type(from_problem(418, {})) is ServerError


def test_the_client_imports_only_the_standard_library_and_itself() -> None:
    imported = set()
    for path in (ROOT / "client" / "reckon" / "client").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    assert len(imported) > 10
    assert sorted(name for name in imported
                  if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("reckon.client")) == []
