"""The sender of the ``webhooks`` process in this process, on a real Redis, toward real receiver processes:
what it sends follows the endpoints as Redis holds them, and whatever a receiver answers, the try's outcome
is recorded."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.settings import Settings
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store
from pipeline.webhooks.endpoints import Endpoints
from pipeline.webhooks.sender import Sender
from tests.conftest import wait_until

from .conftest import Receiver

A, B = "acme." + "a" * 20, "acme." + "b" * 20


def event(job: str, seq: int, tenant: str = "acme") -> dict[str, Any]:
    return {"job": job, "tenant": tenant, "type": "job.cancelled", "seq": seq, "at": 1, "attempt": 0,
            "from": "queued", "to": "cancelled", "reason": "cancelled"}


@pytest.fixture
def sender(store: Store, settings: Settings) -> Iterator[Sender]:
    running = Sender(store, dataclasses.replace(
        settings, webhook_allow_private=True, webhook_timeout_seconds=5.0, webhook_retry_first_seconds=0.2,
        webhook_retry_max_seconds=1.0, webhook_retry_window_seconds=60.0))
    try:
        yield running
    finally:
        running.pool.shutdown(wait=True)


def fan_out(sender: Sender, tenant: str, *events: dict[str, Any]) -> None:
    """The events pushed to the tenant's outbox and fanned out as the sender's loop does."""
    shard = TenantKeys(tenant).shard
    sender.deliveries.redis.rpush(shard.webhook_outbox, *(orjson.dumps(e) for e in events))
    while sender.deliveries.move_one(shard, 0.01) or sender.deliveries.redis.llen(shard.webhook_taking):
        sender.deliveries.fan_out(shard, sender.endpoints.all)


def delivery(store: Store, endpoint: str, message: str) -> dict[str, Any] | None:
    raw = store.redis.hget(TenantKeys("acme").shard.webhook_deliveries, f"{endpoint}/{message}")
    return None if raw is None else orjson.loads(raw)


def test_a_huge_retry_after_is_clamped_to_the_longest_delay_and_the_try_is_recorded(
        store: Store, tenant, sender: Sender, receiver: Receiver) -> None:
    """A 400-digit Retry-After (a float of it is inf) is a failed try due again after the longest delay,
    recorded under its lease: not an OverflowError that leaves the lease to lapse and the delivery to be
    sent again every lease, never exhausted."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", f"{receiver.url}/hook", ["job.cancelled"])
    receiver.plan("429:" + "9" * 400)
    fan_out(sender, "acme", event(A, 1))
    sender.take(TenantKeys("acme").shard)
    wait_until(lambda: (delivery(store, endpoint["id"], f"msg_{A}.1") or {}).get("next_at"), timeout=10)
    row = delivery(store, endpoint["id"], f"msg_{A}.1")
    assert row is not None and "lease" not in row
    assert (row["attempts"], row["last_status"], row["last_error"]) == (1, 429, "HTTP 429")
    assert row["next_at"] - row["last_at"] == 1_000  # the longest delay (1 s here), not what was asked for
    assert [r["answer"] for r in receiver.received()] == ["429:" + "9" * 400]


def test_an_outcome_that_cannot_be_written_is_recorded_as_a_failed_try(
        store: Store, tenant, sender: Sender) -> None:
    """A defect in making an outcome (here a delay no integer holds) still writes the try, as a failure
    after the backoff: it counts against the window, and the delivery ends exhausted, never looping."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", "http://127.0.0.1:9/hook", ["job.cancelled"])
    fan_out(sender, "acme", event(A, 1))
    shard = TenantKeys("acme").shard
    [item] = sender.deliveries.take(shard, lambda e: (1, 0), most=1, lease_ms=60_000, window_ms=60_000).taken
    sender.inflight[item.endpoint] += 1  # as a take hands it to a thread
    sender.tenant_inflight[item.tenant] += 1
    sender.finish(shard, item, "retry", float("inf"), "HTTP 429", 429)
    row = delivery(store, endpoint["id"], f"msg_{A}.1")
    assert row is not None and "lease" not in row
    assert (row["attempts"], row["last_status"], row["last_error"]) == (1, 429, "outcome not recorded: OverflowError")
    assert 0 < row["next_at"] - row["last_at"] <= 1_000  # the backoff (at most 1 s here)
    assert sender.inflight[item.endpoint] == 0 and sender.tenant_inflight == {}


def messages(receiver: Receiver) -> list[str]:
    return [r["headers"]["webhook-id"] for r in receiver.received()]


def test_an_endpoint_added_or_removed_just_before_an_event_gets_it_or_not_at_once(
        store: Store, tenant, sender: Sender, receiver: Receiver, tmp_path: Path) -> None:
    """The sender's own loop: the tenant's first event goes to its first endpoint; then a second endpoint is
    added and the first removed, and the next event (within a second of the first) goes to the second
    alone: no endpoint list kept from the event before (a lost delivery to the new one, a delivery after
    its removal to the old one)."""
    tenant()
    (tmp_path / "other").mkdir()
    other = Receiver(tmp_path / "other")
    other.start()
    stop = threading.Event()
    loop = threading.Thread(target=sender.run, args=(stop,))
    endpoints, shard = Endpoints(store), TenantKeys("acme").shard
    try:
        first, _ = endpoints.add("acme", f"{receiver.url}/first", ["job.cancelled"])
        loop.start()
        store.redis.rpush(shard.webhook_outbox, orjson.dumps(event(A, 1)))
        wait_until(lambda: messages(receiver) == [f"msg_{A}.1"], timeout=10)
        endpoints.add("acme", f"{other.url}/second", ["job.cancelled"])
        endpoints.remove("acme", first["id"])
        store.redis.rpush(shard.webhook_outbox, orjson.dumps(event(B, 1)))
        wait_until(lambda: messages(other) == [f"msg_{B}.1"], timeout=10)
        wait_until(lambda: store.redis.hlen(shard.webhook_deliveries) == 0, timeout=10)  # every try settled
        assert messages(receiver) == [f"msg_{A}.1"] and messages(other) == [f"msg_{B}.1"]
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(timeout=30)
        other.stop()


def test_a_delivery_whose_last_outcome_was_never_written_is_exhausted_once_its_window_is_over(
        store: Store, tenant, sender: Sender, receiver: Receiver) -> None:
    """A try whose outcome is never written (its process died after sending, each time) leaves its delivery
    leased: when that lease has ended past the delivery's window, the next take exhausts it (listed for
    redelivery, and the job's next event goes), never sending it again each lease for ever."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", f"{receiver.url}/hook", ["job.cancelled"])
    fan_out(sender, "acme", event(A, 1), event(A, 2))  # 2 waits in the job's line behind 1
    shard = TenantKeys("acme").shard
    member = f"{endpoint['id']}/msg_{A}.1"
    row = orjson.loads(store.redis.hget(shard.webhook_deliveries, member))
    assert store.redis.zscore(shard.webhook_due(endpoint["id"]), member) <= store.server_ms(shard)  # due
    # as a dead process's first try leaves it, 61 s ago (the window is 60 s), its lease ended since
    row.update(attempts=1, first_at=store.server_ms(shard) - 61_000, lease="dead:0:1")
    store.redis.hset(shard.webhook_deliveries, member, orjson.dumps(row))
    sender.take(shard)  # exhausts 1, makes 2 due
    sender.take(shard)
    wait_until(lambda: messages(receiver) == [f"msg_{A}.2"] and store.redis.hlen(shard.webhook_deliveries) == 1)
    [listed] = sender.deliveries.exhausted("acme", endpoint["id"])
    assert (listed["id"], listed["attempts"], listed["last_error"]) == \
        (f"msg_{A}.1", 1, "outcome not recorded (its lease ended)")
    assert messages(receiver) == [f"msg_{A}.2"]
