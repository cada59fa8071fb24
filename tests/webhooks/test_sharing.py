"""Each tenant's share of the webhooks process: one tenant's hanging endpoints hold at most its share of
the sending threads (``RECKON_WEBHOOK_TENANT_CONCURRENCY``), and another tenant's webhook goes meanwhile.
The sender runs its own loop in this process, on a real Redis, toward real receiver processes."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import orjson

from pipeline.settings import DEFAULT_WEBHOOK_TENANT_CONCURRENCY, DEFAULT_WEBHOOK_THREADS, Settings
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store
from pipeline.webhooks.endpoints import MAX_ENDPOINTS, Endpoints
from pipeline.webhooks.sender import Sender
from tests.conftest import wait_until

from .conftest import Receiver
from .test_sender import event, messages

JOBS = 8


def test_a_tenants_hanging_endpoints_hold_its_share_and_another_tenants_webhook_goes_at_once(
        store: Store, settings: Settings, receiver: Receiver, tmp_path: Path) -> None:
    """Tenant noisy has 16 endpoints that hang until the test lets them go, and 8 jobs' events for each
    (128 deliveries, far more than the 16 threads); quiet's one webhook then arrives while every one of
    noisy's requests still hangs, and noisy never had more than its share in flight. Once let go, each of
    noisy's deliveries arrives exactly once."""
    (tmp_path / "quiet").mkdir()
    quiet = Receiver(tmp_path / "quiet")
    quiet.start()
    sender = Sender(store, dataclasses.replace(settings, webhook_allow_private=True, webhook_timeout_seconds=120.0))
    stop = threading.Event()
    loop = threading.Thread(target=sender.run, args=(stop,))
    endpoints = Endpoints(store)
    try:
        assert DEFAULT_WEBHOOK_TENANT_CONCURRENCY < DEFAULT_WEBHOOK_THREADS < JOBS * MAX_ENDPOINTS
        receiver.plan(*["hold"] * (JOBS * MAX_ENDPOINTS))
        noisy = [endpoints.add("noisy", f"{receiver.url}/{i}", ["job.cancelled"])[0]["id"]
                 for i in range(MAX_ENDPOINTS)]
        endpoints.add("quiet", f"{quiet.url}/hook", ["job.cancelled"])
        loop.start()
        jobs = [f"noisy.{n:020x}" for n in range(JOBS)]
        store.redis.rpush(TenantKeys("noisy").shard.webhook_outbox,
                          *(orjson.dumps(event(job, 1, "noisy")) for job in jobs))
        wait_until(lambda: len(receiver.received()) == DEFAULT_WEBHOOK_TENANT_CONCURRENCY, timeout=20)
        quiet_job = "quiet." + "a" * 20
        store.redis.rpush(TenantKeys("quiet").shard.webhook_outbox, orjson.dumps(event(quiet_job, 1, "quiet")))
        wait_until(lambda: messages(quiet) == [f"msg_{quiet_job}.1"], timeout=20)
        # every noisy request still hangs (none can be answered before the release): quiet's went past them
        assert len(receiver.received()) == DEFAULT_WEBHOOK_TENANT_CONCURRENCY
        wait_until(lambda: sender.tenant_inflight == {"noisy": DEFAULT_WEBHOOK_TENANT_CONCURRENCY})  # quiet's settled
        receiver.release()
        wait_until(lambda: store.redis.hlen(TenantKeys("noisy").shard.webhook_deliveries) == 0, timeout=60)
        got = sorted((r["path"], r["headers"]["webhook-id"]) for r in receiver.received())
        assert got == sorted((f"/{i}", f"msg_{job}.1") for i in range(MAX_ENDPOINTS) for job in jobs)
        assert len(noisy) == MAX_ENDPOINTS and sender.tenant_inflight == {}
    finally:
        receiver.release()
        stop.set()
        if loop.is_alive():
            loop.join(timeout=60)
        sender.pool.shutdown(wait=True)
        quiet.stop()
