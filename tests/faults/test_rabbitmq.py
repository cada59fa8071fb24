"""The broker seam: reckon's processes with Dramatiq's RabbitMQ broker (``RECKON_BROKER_URL=amqp://...``).

State stays in Redis; only the queue moves. Runs against a private rabbitmq-server (ops/bench/rabbitmq.py)
and skips, saying why, when Debian's rabbitmq-server is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pika
import pytest
import redis

from ops.bench import rabbitmq
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import REDIS_PORT, wait_until
from tests.faults.conftest import Stack

#: The queues a job's messages cross in watch mode: its run message, then its collect message.
USED_QUEUES = ("reckon-interactive", "reckon-batch", "reckon-collect")


@pytest.fixture(scope="module")
def amqp_url() -> Iterator[str]:
    reason = rabbitmq.missing()
    if reason:  # as for chromium: make test installs it, so its absence is a broken set-up, not a skip
        pytest.fail(f"{reason} (make test installs rabbitmq-server)")
    with rabbitmq.private_rabbitmq() as url:
        yield url


def queue_depths(url: str) -> dict[str, tuple[int, int]]:
    """Queue -> (messages ready, consumers), asked of RabbitMQ (a passive declare fails on a missing queue)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        depths = {}
        for name in USED_QUEUES:
            method = channel.queue_declare(name, passive=True).method
            depths[name] = (method.message_count, method.consumer_count)
        return depths
    finally:
        conn.close()


def test_jobs_run_end_to_end_through_rabbitmq(amqp_url, redis_client, store, tmp_path: Path) -> None:
    create_tenant(redis_client, "acme", 1_000)
    auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
    stack = Stack(tmp_path, RECKON_BROKER_URL=amqp_url)
    try:
        stack.start_provider(delay=0.05)
        stack.start_web()
        stack.start_worker()
        stack.start_sweeper()
        locations = []
        for i, priority in enumerate(["interactive", "batch", "interactive"]):
            body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": i}}},
                    "outputs": 2, "priority": priority}
            status, headers, _ = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": f"amqp-{i}"})
            assert status == 202
            locations.append(headers["location"])

        def states() -> list[str]:
            return [orjson.loads(stack.api("GET", where, **auth)[2])["state"] for where in locations]

        wait_until(lambda: states() == ["completed"] * 3, timeout=60)
        costs = [orjson.loads(stack.api("GET", where, **auth)[2])["cost"] for where in locations]
        assert costs == [{"price": 10, "ceiling": 60, "reserved": 0, "uncertain": 0, "settled": 20,
                          "attempts": [{"attempt": 1, "server": "comfyui", "units": 20}]}] * 3
        usage = orjson.loads(stack.api("GET", "/v1/usage", **auth)[2])
        assert usage == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 60, "available": 940}
        charges = stack.charges()
        assert (len(charges["charges"]), charges["total_units"]) == (3, 60)  # each job executed once
        # The messages crossed RabbitMQ: its queues exist, drained, with the worker consuming each;
        # Redis's broker database was never written.
        assert queue_depths(amqp_url) == {name: (0, 1) for name in USED_QUEUES}
        broker_db = redis.Redis(port=REDIS_PORT, db=1)
        try:
            assert broker_db.dbsize() == 0
        finally:
            broker_db.close()
    finally:
        stack.stop(graceful=False)
