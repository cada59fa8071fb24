"""Dramatiq's Redis broker, kept in its own logical database, and how jobs are published.

Dramatiq's maintenance runs ``KEYS`` over its database, so it never shares one
with reckon's state (``RECKON_BROKER_URL``, by default database 1; a ``redis+sentinel://`` URL
follows the master through failovers). An ``amqp://`` (or
``amqps://``) ``RECKON_BROKER_URL`` chooses Dramatiq's RabbitMQ broker instead: a message
carries only a job id and reckon's state never lives in the broker, so nothing else changes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff
from dramatiq.middleware import Retries

from .redisconn import broker_client
from .settings import Settings

log = logging.getLogger(__name__)

#: priority (or "reconcile") -> (queue, actor name). Workers take interactive work first.
ROUTES = {
    "interactive": ("reckon-interactive", "run_interactive"),
    "batch": ("reckon-batch", "run_batch"),
    "reconcile": ("reckon-reconcile", "reconcile_job"),
    "collect": ("reckon-collect", "collect_job"),
    "unparked": ("reckon-unparked", "run_unparked"),
}


def build_broker(settings: Settings) -> dramatiq.Broker:
    """A Redis broker without Dramatiq's Retries: reckon's own state decides every retry."""
    broker: dramatiq.Broker
    if settings.broker_url.startswith(("amqp://", "amqps://")):
        broker = rabbitmq_broker(settings.broker_url)
    else:
        # one server or, for a redis+sentinel:// URL, the master Sentinel names now (pipeline/redisconn.py)
        broker = WakingRedisBroker(client=broker_client(settings), namespace="dramatiq")
    for middleware in list(broker.middleware):
        if isinstance(middleware, Retries):
            broker.middleware.remove(middleware)
    return broker


class WakingRedisBroker(RedisBroker):
    """Dramatiq's Redis broker whose idle consumers wake as soon as a message arrives.

    Dramatiq's Redis consumer polls an empty queue with a back-off that grows to the worker timeout
    (1 s), so a job admitted to an idle stack waited up to a second for its claim. Here an idle
    consumer waits instead on the queue's keyspace event (``notify-keyspace-events`` with ``K``
    and ``l``: Redis publishes each RPUSH onto the list itself, so publishing costs no extra round
    trip), for at most the same back-off; without the events it polls exactly as Dramatiq does."""

    _checked = False

    def declare_queue(self, queue_name: str) -> None:
        """Declare ``queue_name`` without its delay queue (``<queue>.DQ``): reckon delays nothing in
        the broker (a retry waits in the state's due set, see "Failures by evidence"), so no consumer
        polls a delay queue that never holds a message (Dramatiq's Worker adds one per declared delay
        queue: five more per process)."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def enqueue(self, message: dramatiq.Message, *, delay: int | None = None) -> dramatiq.Message:
        """Send ``message`` now; a delay is refused, since no consumer serves a delay queue."""
        if delay is not None:
            raise ValueError("reckon's Redis broker has no delay queues: a message is sent now or not at all")
        return super().enqueue(message)

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> dramatiq.Consumer:
        if not self._checked:
            self._checked = True
            self._check_events()
        return WakingConsumer(self, queue_name, prefetch, timeout)

    def _check_events(self) -> None:
        """Say so once when Redis does not publish the events an idle consumer waits for."""
        try:
            flags = self.client.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
        except redis.RedisError:  # CONFIG refused (a managed Redis): it may still publish them
            return
        flags = flags.decode() if isinstance(flags, bytes) else flags
        if "K" not in flags or not ({"l", "A"} & set(flags)):
            log.warning("Redis does not publish list keyspace events (notify-keyspace-events Kl): "
                        "idle workers poll their queues and may take up to a second to pick a job up")


#: The list events that mean a message arrived (Dramatiq's enqueue and requeue push; fetches pop).
PUSHES = frozenset({"rpush", "lpush", b"rpush", b"lpush"})


class WakingConsumer(_RedisConsumer):
    """A Redis consumer that waits for its queue's keyspace event while the queue is empty.

    It listens only while idle: subscribed when its queue is found empty, unsubscribed as soon as it
    takes a message, so a busy consumer's events never pile up in Redis (to be read through on its
    next wait), and only a push wakes it (another consumer's fetch does not). A consumer that lost
    the race for a message stays subscribed."""

    def __init__(self, broker: RedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, 0)  # 0: its own idle sleep is ours to do
        self.idle_ms = timeout
        db = broker.client.connection_pool.connection_kwargs.get("db", 0)
        self.queue_key = f"{broker.namespace}:{queue_name}"
        self.channel = f"__keyspace@{db}__:{self.queue_key}"
        self.events: Any = None
        #: A SUBSCRIBE is sent (``subscribed``), and Redis confirmed it (``listening``).
        self.subscribed = self.listening = False

    def __next__(self) -> Any:
        message = super().__next__()
        if message is not None and self.subscribed:
            self._guard(self._unlisten)
        if message is None:
            _, wait_ms = compute_backoff(max(0, self.misses - 1), max_backoff=self.idle_ms)
            if self.outstanding_message_count < self.prefetch:  # the queue was empty
                self._wait(wait_ms / 1000)
            else:  # as many messages taken as allowed: their acks come through the worker, not Redis
                time.sleep(wait_ms / 1000)
        return message

    def _wait(self, seconds: float) -> None:
        """Until a message is pushed onto the queue's list, or ``seconds``."""
        deadline = time.monotonic() + seconds
        if not self._guard(lambda: self._until_pushed(deadline)):
            time.sleep(max(0.0, deadline - time.monotonic()))

    def _until_pushed(self, deadline: float) -> None:
        if not self.subscribed:
            if self.events is None:
                self.events = self.broker.client.pubsub()
            self.events.subscribe(self.channel)
            self.subscribed = True
        while (left := deadline - time.monotonic()) > 0:
            event = self.events.get_message(timeout=left)
            if event is None:
                continue
            if event["type"] == "subscribe":  # events reach us from here on
                self.listening = True
                if self.broker.client.llen(self.queue_key):  # pushed between the fetch and the subscription
                    return
            elif event["type"] == "message" and self.listening and event["data"] in PUSHES:
                return

    def _unlisten(self) -> None:
        self.subscribed = self.listening = False
        self.events.unsubscribe(self.channel)

    def _guard(self, call: Any) -> bool:
        """``call``; False if Redis failed it (a failover): then poll, and subscribe anew next time."""
        try:
            call()
            return True
        except redis.RedisError:
            log.debug("keyspace events of %s unavailable; polling", self.queue_name)
            self.close()
            return False

    def close(self) -> None:
        self.subscribed = self.listening = False
        if self.events is not None:
            try:
                self.events.close()
            except redis.RedisError:
                pass
            self.events = None


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
        queue_name, actor_name = ROUTES[priority]
        self.broker.enqueue(
            dramatiq.Message(queue_name=queue_name, actor_name=actor_name, args=(job_id,), kwargs={}, options={})
        )
