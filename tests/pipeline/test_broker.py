"""build_broker: the URL's scheme chooses Dramatiq's broker; neither keeps Dramatiq's Retries."""

from __future__ import annotations

import dataclasses

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries

from pipeline.settings import Settings
from pipeline.work.broker import build_broker


def test_an_amqp_url_builds_rabbitmq_with_publisher_confirms() -> None:
    # RabbitmqBroker connects on first use, so no server is needed to build it.
    broker = build_broker(dataclasses.replace(Settings(), broker_url="amqp://guest:guest@127.0.0.1:9/%2F"))
    try:
        assert isinstance(broker, RabbitmqBroker)
        assert broker.confirm_delivery is True
        assert (broker.parameters.host, broker.parameters.port) == ("127.0.0.1", 9)
        assert not any(isinstance(m, Retries) for m in broker.middleware)
    finally:
        broker.close()


def test_a_redis_url_builds_the_redis_broker(redis_server: str) -> None:
    broker = build_broker(dataclasses.replace(Settings(), broker_url=redis_server[:-1] + "1"))
    try:
        assert isinstance(broker, RedisBroker)
        assert broker.namespace == "dramatiq"
        assert not any(isinstance(m, Retries) for m in broker.middleware)
    finally:
        broker.close()


def test_the_redis_broker_declares_no_delay_queues_and_refuses_a_delay(redis_server: str) -> None:
    """reckon delays nothing in the broker: a worker serves each queue with one consumer, no ``.DQ``."""
    broker = build_broker(dataclasses.replace(Settings(), broker_url=redis_server[:-1] + "1"))
    assert isinstance(broker, RedisBroker)
    worker = Worker(broker, worker_threads=1)
    try:
        dramatiq.actor(queue_name="plain", actor_name="plain_noop", broker=broker)(lambda: None)
        worker.start()
        assert sorted(worker.consumers) == ["plain"]
        assert broker.get_declared_delay_queues() == set()
        message: dramatiq.Message[None] = dramatiq.Message(queue_name="plain", actor_name="plain_noop", args=(), kwargs={}, options={})
        with pytest.raises(ValueError, match="no delay queues"):
            broker.enqueue(message, delay=1000)
    finally:
        worker.stop()
        broker.close()
        broker.client.close()
