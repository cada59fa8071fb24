"""An idle Redis consumer wakes on its queue's keyspace event, and polls as Dramatiq does without it."""

from __future__ import annotations

import threading
import time

import dramatiq
import redis

from pipeline.broker import WakingRedisBroker
from tests.conftest import REDIS_PORT


def message(n: int) -> dramatiq.Message:
    return dramatiq.Message(queue_name="wake-test", actor_name="noop", args=(f"job-{n}",), kwargs={}, options={})


def first_message(consumer, limit_s: float = 30.0):
    """Iterate the consumer until it yields a message (None means it waited idle)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = next(consumer)
        if found is not None:
            return found
    raise AssertionError("no message")


def test_an_idle_consumer_wakes_on_the_enqueue_not_at_its_idle_timeout(redis_server: str) -> None:
    client = redis.Redis(port=REDIS_PORT, db=1)
    client.config_set("notify-keyspace-events", "Kl")
    broker = WakingRedisBroker(client=client, namespace="waketest")
    broker.declare_queue("wake-test")
    consumer = broker.consume("wake-test", prefetch=4, timeout=600_000)  # idle back-off up to 10 minutes
    try:
        consumer.misses = 30  # as after a long idle time: its next wait would be 5 to 10 minutes
        timer = threading.Timer(0.3, broker.enqueue, args=(message(1),))  # sent while it waits
        timer.start()
        started = time.monotonic()
        got = first_message(consumer)
        timer.join()
        assert got.args == ("job-1",)
        assert time.monotonic() - started < 60  # woken by the event, not at the end of its back-off
        consumer.ack(got)
    finally:
        consumer.close()
        broker.flush_all()
        client.close()


def test_without_keyspace_events_an_idle_consumer_polls(redis_server: str) -> None:
    client = redis.Redis(port=REDIS_PORT, db=1)
    client.config_set("notify-keyspace-events", "")
    broker = WakingRedisBroker(client=client, namespace="waketest")
    broker.declare_queue("wake-test")
    consumer = broker.consume("wake-test", prefetch=4, timeout=100)
    try:
        assert next(consumer) is None  # empty: waited up to its back-off
        broker.enqueue(message(2))
        got = first_message(consumer)
        assert got.args == ("job-2",)
        consumer.ack(got)
        assert client.hlen("waketest:wake-test.msgs") == 0
    finally:
        client.config_set("notify-keyspace-events", "Kl")
        consumer.close()
        broker.flush_all()
        client.close()
