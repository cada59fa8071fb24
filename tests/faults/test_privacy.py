"""No workflow, API key or header value reaches a log line, a stored record (other than the
workflow's own key) or a webhook, whatever fault the provider throws: a canary string goes through every
simulated fault class on a real stack (gunicorn, Dramatiq, watcher, sweeper, webhooks, simulated ComfyUI)
and a real webhook receiver."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pipeline.state.keys import TenantKeys
from tests.conftest import wait_until
from tests.faults.conftest import BIN, Stack
from tests.faults.test_crashes import setup
from tests.webhooks.conftest import receiver  # noqa: F401 (a fixture, used by name)

FAULTS = [  # /system_stats first: a worker reads a server's epoch at most every 5 s (executor.EPOCH_READ_S),
    # so only its first submission is sure to read it
    {"kind": "read_error", "path": "/system_stats", "status": 0},
    {"kind": "error_before"}, {"kind": "error_after"}, {"kind": "rate_limit", "retry_after": 1},
    {"kind": "policy"}, {"kind": "drop"}, {"kind": "partial", "produce": 1}, {"kind": "latency", "seconds": 0.5},
    {"kind": "read_error", "path": "/history", "status": 500}, {"kind": "read_error", "path": "/view", "status": 404},
    {"kind": "auth"},
]


@pytest.fixture
def stack(redis_client, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path, RECKON_WEBHOOK_ALLOW_PRIVATE="1")
    try:
        yield running
    finally:
        running.stop(graceful=False)


def test_a_canary_in_workflow_and_headers_is_never_logged_nor_stored(
        stack, redis_client, store, receiver) -> None:  # noqa: F811 (the fixture imported above)
    canary = f"canary-{secrets.token_hex(8)}"
    auth = setup(stack, redis_client)
    stack.start_provider(delay=0.1)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    stack.start("webhooks", str(BIN / "python"), "-m", "pipeline.webhooks.sender")
    status, _, _ = stack.api("POST", "/v1/webhooks", {"url": receiver.url, "types": [
        "job.completed", "job.failed", "job.needs_review", "job.progress"]}, **auth)
    assert status == 201
    jobs: list[str] = []

    def moved_on(job_ids: list[str], states: tuple[str, ...]) -> bool:
        store.clear_provider("comfyui")  # the auth fault marks the server; an operator clears it
        return all((store.job(j) or {}).get("state") not in states for j in job_ids)

    for n, fault in enumerate(FAULTS):
        stack.sim_post("/sim/faults", {"faults": [fault | {"times": 1}]})
        body = {"kind": "image", "outputs": 2,
                "workflow": {"3": {"class_type": "KSampler", "inputs": {"text": canary, "seed": n}}}}
        status, headers, _ = stack.api("POST", "/v1/jobs", body, **auth, **{
            "Idempotency-Key": f"canary-{n}", "User-Agent": canary, "X-Trace": canary})
        assert status == 202
        jobs.append(headers["location"].rsplit("/", 1)[1])
        wait_until(lambda: stack.sim_faults()[0]["times"] == 0, timeout=20)  # this fault was thrown
    wait_until(lambda: moved_on(jobs, ("queued", "running", "retry_wait", "reconciling")), timeout=90)
    states = [store.job(j)["state"] for j in jobs]
    assert set(states) <= {"completed", "failed", "needs_review"} and "failed" in states  # the policy refusal
    hooked = {f"msg_{j}" for j in jobs}  # every job's last state is hooked: each one's webhook arrives
    wait_until(lambda: {r["headers"]["webhook-id"].rsplit(".", 1)[0] for r in receiver.received()} >= hooked, 30)
    assert [r["headers"]["webhook-id"] for r in receiver.received() if canary in orjson.dumps(r).decode()] == []
    stack.stop()  # flush every process's log
    logs = {path.name: path.read_text(errors="replace") for path in stack.logs.iterdir()}
    assert {"web.log", "worker.log", "watcher.log", "sweeper.log", "webhooks.log"} <= set(logs)
    assert [name for name, text in logs.items() if canary in text] == []
    assert any(canary in (redis_client.get(k) or "") for k in redis_client.scan_iter("*:workflow"))  # the probe works
    stored = []
    for key in redis_client.scan_iter("*"):
        if key.endswith(":workflow"):
            continue  # the workflow itself, kept for a dead letter's replay
        kind = redis_client.type(key)
        value = {"hash": redis_client.hgetall, "list": lambda k: redis_client.lrange(k, 0, -1),
                 "string": redis_client.get, "zset": lambda k: redis_client.zrange(k, 0, -1),
                 "set": redis_client.smembers, "stream": lambda k: redis_client.xrange(k)}[kind](key)
        if canary in orjson.dumps(value, default=list).decode():
            stored.append(key)
    assert stored == []
    assert redis_client.zcard(TenantKeys("acme").jobs) == len(FAULTS)
