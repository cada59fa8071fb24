"""Dramatiq's Redis broker, kept in its own logical database, and how jobs are published.

Dramatiq's maintenance runs ``KEYS`` over its database, so it never shares one
with reckon's state (``RECKON_BROKER_URL``, by default database 1; a ``redis+sentinel://`` URL
follows the master through failovers). An ``amqp://`` (or
``amqps://``) ``RECKON_BROKER_URL`` chooses Dramatiq's RabbitMQ broker instead: a message
carries only a job id and reckon's state never lives in the broker, so nothing else changes.
"""

from __future__ import annotations

import dramatiq
from dramatiq.middleware import Retries

from pipeline.settings import Settings
from pipeline.state.redisconn import broker_client
from pipeline.work.waking import WakingRedisBroker

#: priority (or "reconcile") -> (queue, actor name). Workers take interactive work first.
ROUTES = {
    "interactive": ("reckon-interactive", "run_interactive"),
    "batch": ("reckon-batch", "run_batch"),
    "reconcile": ("reckon-reconcile", "reconcile_job"),
    "collect": ("reckon-collect", "collect_job"),
    "unparked": ("reckon-unparked", "run_unparked"),
}


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A Redis broker (pipeline/work/waking.py: idle consumers wake on a push, no delay queues) or
    RabbitMQ's, without Dramatiq's Retries: reckon's own state decides every retry."""
    broker: dramatiq.Broker
    if settings.broker_url.startswith(("amqp://", "amqps://")):
        broker = rabbitmq_broker(settings.broker_url)
    else:
        # one server or, for a redis+sentinel:// URL, the master Sentinel names now (pipeline/state/redisconn.py)
        broker = WakingRedisBroker(client=broker_client(settings), namespace="dramatiq")
    for middleware in list(broker.middleware):
        if isinstance(middleware, Retries):
            broker.middleware.remove(middleware)
    return broker


def rabbitmq_broker(url: str) -> dramatiq.Broker:
    """Dramatiq's RabbitMQ broker with publisher confirms: ``enqueue`` returns only once RabbitMQ
    holds the message (persistent), as a Redis broker's reply does, so the outbox entry that the
    publisher then clears never hides a message the broker lost."""
    from dramatiq.brokers.rabbitmq import RabbitmqBroker  # pika: only for this broker

    return RabbitmqBroker(url=url, confirm_delivery=True)


class Publisher:
    """Sends a job's message (its id, nothing else) to the queue for its priority, or to
    the reconcile or collect queue (``publish(job_id, "reconcile")``)."""

    def __init__(self, broker: dramatiq.Broker) -> None:
        self.broker = broker

    def __call__(self, job_id: str, priority: str) -> None:
        self.broker.enqueue(message(job_id, priority))

    def many(self, jobs: list[tuple[str, str]]) -> None:
        """Each (job id, priority)'s message: in one round trip on reckon's Redis broker, else one by one."""
        messages = [message(job_id, priority) for job_id, priority in jobs]
        if isinstance(self.broker, WakingRedisBroker):
            self.broker.enqueue_many(messages)
            return
        for each in messages:
            self.broker.enqueue(each)


def message(job_id: str, priority: str) -> dramatiq.Message:
    queue_name, actor_name = ROUTES[priority]
    return dramatiq.Message(queue_name=queue_name, actor_name=actor_name, args=(job_id,), kwargs={}, options={})
