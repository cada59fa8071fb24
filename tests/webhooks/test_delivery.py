"""Webhooks end to end: the real stack (gunicorn, Dramatiq, watcher, sweeper, simulated provider), the
``webhooks`` process and a real receiver process that fails in each way a receiver does."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import wait_until
from tests.faults.conftest import BIN, Stack

from .conftest import Receiver

MARKER = "do-not-leak-this-prompt"
WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5, "text": MARKER}}}
HOOK_TYPES = {"completed": "job.completed", "failed": "job.failed", "cancelled": "job.cancelled",
              "needs_review": "job.needs_review"}


@pytest.fixture
def hooks_stack(redis_client, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path, RECKON_WEBHOOK_ALLOW_PRIVATE="1", RECKON_WEBHOOK_TIMEOUT_SECONDS="1",
                    RECKON_WEBHOOK_RETRY_FIRST_SECONDS="0.2", RECKON_WEBHOOK_RETRY_MAX_SECONDS="1",
                    RECKON_WEBHOOK_RETRY_WINDOW_SECONDS="60")
    try:
        yield running
    finally:
        running.stop(graceful=False)


def start(stack: Stack, delay: float = 0.0) -> None:
    stack.start_provider(delay)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    start_webhooks(stack)


def start_webhooks(stack: Stack, pause_at: str | None = None) -> None:
    stack.start("webhooks", str(BIN / "python"), "-m", "pipeline.webhooks.sender", pause_at=pause_at)


def register(stack: Stack, key: str, url: str, types: list[str]) -> dict[str, Any]:
    status, _, body = stack.api("POST", "/v1/webhooks", {"url": url, "types": types},
                                Authorization=f"Bearer {key}")
    assert status == 201, body
    return orjson.loads(body)


def submit(stack: Stack, key: str, intent: str) -> str:
    status, _, body = stack.api("POST", "/v1/jobs", {"kind": "image", "workflow": WORKFLOW, "outputs": 2},
                                Authorization=f"Bearer {key}", **{"Idempotency-Key": intent})
    assert status == 202, body
    return orjson.loads(body)["id"]


def expected_messages(stack: Stack, key: str, job_id: str, types: set[str]) -> list[str]:
    """The webhook-ids the job's events should have made, in order: its state events into a hooked state,
    and, when progress is asked for, its progress points: the seqs between its state events (one counter
    numbers both; a finished job's progress points are no longer kept)."""
    _, _, body = stack.api("GET", f"/v1/jobs/{job_id}/events", Authorization=f"Bearer {key}")
    states = {e["seq"]: e for e in orjson.loads(body)["events"] if e["type"] == "state"}
    out = []
    for seq in range(1, max(states) + 1):
        kind = HOOK_TYPES.get(states[seq]["to"]) if seq in states else "job.progress"
        if kind in types:
            out.append(f"msg_{job_id}.{seq}")
    return out


def job_state(stack: Stack, key: str, job_id: str) -> str:
    _, _, body = stack.api("GET", f"/v1/jobs/{job_id}", Authorization=f"Bearer {key}")
    return orjson.loads(body)["state"]


def delivered(receiver: Receiver) -> dict[str, dict[str, Any]]:
    return {r["headers"]["webhook-id"]: r for r in receiver.received() if r["answer"] == "ok"}


def test_every_event_arrives_signed_in_order_per_job_through_a_failing_receiver(
        hooks_stack: Stack, tenant, receiver: Receiver) -> None:
    key = tenant("acme", 10**6)
    hooks_stack.env["RECKON_PROGRESS_INTERVAL_SECONDS"] = "0.25"  # a point every 0.25 s at most, not every 1 s
    start(hooks_stack, delay=0.75)  # four steps of 0.19 s: two or more progress points a job
    types = {"job.completed", "job.cancelled", "job.progress"}
    endpoint = register(hooks_stack, key, f"{receiver.url}/hook", sorted(types))
    receiver.stop()  # down for a while first: tries fail with connection refused
    jobs = [submit(hooks_stack, key, f"intent-{i}") for i in range(6)]
    status, _, _ = hooks_stack.api("POST", f"/v1/jobs/{jobs[5]}/cancel", {}, Authorization=f"Bearer {key}")
    assert status in (200, 202)
    wait_until(lambda: all(job_state(hooks_stack, key, j) in ("completed", "cancelled") for j in jobs), timeout=60)
    receiver.start()
    receiver.plan("500", "timeout", "drop", "429:1", "500")
    expected = {j: expected_messages(hooks_stack, key, j, types) for j in jobs}
    assert all(expected.values()) and sum(map(len, expected.values())) >= 12
    wanted = {m for ms in expected.values() for m in ms}
    wait_until(lambda: wanted <= set(delivered(receiver)), timeout=60)

    got = receiver.received()
    assert {r["answer"] for r in got} >= {"500", "timeout", "drop", "429:1"}
    assert set(delivered(receiver)) == wanted  # nothing else was sent
    by_job: dict[str, list[int]] = defaultdict(list)
    for request in got:  # every request, the failed ones too: never a later event before an earlier one
        job_id, seq = request["headers"]["webhook-id"].removeprefix("msg_").rsplit(".", 1)
        by_job[job_id].append(int(seq))
    for job_id, seqs in by_job.items():
        assert seqs == sorted(seqs), (job_id, seqs)
        assert sorted(set(seqs)) == [int(m.rsplit(".", 1)[1]) for m in expected[job_id]]
    verifier = Webhook(endpoint["secret"])
    for message, request in delivered(receiver).items():
        payload = verifier.verify(request["body"].encode(), request["headers"])
        assert payload["data"]["id"] == message.removeprefix("msg_").rsplit(".", 1)[0]
        assert MARKER not in request["body"] and str(hooks_stack.sim_port) not in request["body"]
    completed = [delivered(receiver)[expected[j][-1]] for j in jobs[:5]]
    for request in completed:
        data = orjson.loads(request["body"])["data"]
        assert data["state"] == "completed" and data["event"]["to"] == "completed"
        assert [o["href"] for o in data["outputs"]] == [f"/v1/jobs/{data['id']}/outputs/{i}" for i in (0, 1)]
        assert all(len(o["sha256"]) == 64 for o in data["outputs"])


def test_a_receiver_down_past_the_window_shows_exhausted_deliveries_and_a_redeliver_sends_them(
        redis_client, tenant, receiver: Receiver, tmp_path: Path) -> None:
    (tmp_path / "stack").mkdir()
    stack = Stack(tmp_path / "stack", RECKON_WEBHOOK_ALLOW_PRIVATE="1", RECKON_WEBHOOK_TIMEOUT_SECONDS="1",
                  RECKON_WEBHOOK_RETRY_FIRST_SECONDS="0.2", RECKON_WEBHOOK_RETRY_MAX_SECONDS="0.5",
                  RECKON_WEBHOOK_RETRY_WINDOW_SECONDS="2")
    try:
        key = tenant("acme", 10**6)
        start(stack)
        endpoint = register(stack, key, f"{receiver.url}/hook", ["job.completed"])
        receiver.stop()
        jobs = [submit(stack, key, f"intent-{i}") for i in range(2)]

        def exhausted() -> list[dict[str, Any]]:
            _, _, body = stack.api("GET", f"/v1/webhooks/{endpoint['id']}/deliveries", Authorization=f"Bearer {key}")
            return orjson.loads(body)["deliveries"]

        wait_until(lambda: len(exhausted()) == 2, timeout=60)
        rows = exhausted()
        assert sorted(r["job_id"] for r in rows) == sorted(jobs)
        assert all(r["attempts"] >= 2 and r["last_error"] == "connection refused" for r in rows)
        receiver.start()
        result = subprocess.run([str(BIN / "reckon"), "webhook", "redeliver", "acme", endpoint["id"]],
                                env=stack.env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 and "2 deliveries" in result.stdout, result.stdout + result.stderr
        wait_until(lambda: len(delivered(receiver)) == 2, timeout=30)
        assert sorted(orjson.loads(r["body"])["data"]["id"] for r in delivered(receiver).values()) == sorted(jobs)
        assert exhausted() == []
    finally:
        stack.stop(graceful=False)


def test_a_webhooks_process_killed_after_sending_leaves_the_delivery_to_be_sent_again(
        hooks_stack: Stack, tenant, receiver: Receiver) -> None:
    key = tenant("acme", 10**6)
    hooks_stack.start_provider()
    hooks_stack.start_web()
    hooks_stack.start_worker()
    hooks_stack.start_sweeper()
    start_webhooks(hooks_stack, pause_at="webhook_sent")
    register(hooks_stack, key, f"{receiver.url}/hook", ["job.completed"])
    job = submit(hooks_stack, key, "intent-1")
    hooks_stack.kill_when_paused("webhooks", timeout=60)  # sent and answered, the outcome never recorded
    assert len(receiver.received()) == 1
    start_webhooks(hooks_stack)
    wait_until(lambda: len(receiver.received()) == 2, timeout=30)  # when its lease ends (6 s here)
    first, second = receiver.received()
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"] == f"msg_{job}." + \
        first["headers"]["webhook-id"].rsplit(".", 1)[1]
    assert first["body"] == second["body"]
