"""Dramatiq's Redis broker whose idle consumers fetch only when a message has arrived.

Dramatiq's Redis consumer polls an empty queue with a back-off that grows to the worker timeout
(1 s): a job admitted to an idle stack waited up to a second for its claim, and every idle consumer
ran a fetch (3 commands) about once a second. Here Redis says when a message arrives: with
``notify-keyspace-events Kl`` (ops/redis.conf) it publishes each push onto a queue's list on that
key's keyspace channel, from inside Dramatiq's own enqueue script, so publishing costs no extra
command. Each worker process holds one subscription to the channels of every queue it serves (the
``Doorbell``, read by one thread), and a consumer whose fetch found its queue empty fetches again
only once a push has come since: no empty fetch after each message, no subscription per idle spell.

What polling gave is kept by other means: a listening consumer still fetches every quarter of the
heartbeat timeout (15 s: its process's heartbeat, and a bound on a pickup if the events stop), with
Dramatiq's maintenance pass on its queue at least once per heartbeat timeout (a dead worker's
messages go back to their queue within about two of them, however little the broker is used).
Without the events, or while the subscription is down, a consumer polls exactly as Dramatiq does.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis
from dramatiq.errors import ConnectionClosed

log = logging.getLogger(__name__)

#: The list events that mean a message arrived (Dramatiq's enqueue and requeue push; fetches pop).
PUSHES = frozenset({b"rpush", b"lpush"})
#: A listening consumer fetches at least this often, as a share of the heartbeat timeout (60 s: 15 s).
RECHECK_SHARE = 4
#: How long the doorbell's thread waits for an event at a time (s): how soon it subscribes the channel
#: of a consumer just made, or stops.
READ_S = 0.25
#: After this long without an event the doorbell pings Redis; as long again without an answer, and it
#: takes its connection for lost and subscribes anew (s).
PING_S = 5.0
#: The wait before the doorbell subscribes again after losing its connection (s).
RESUBSCRIBE_S = 1.0


@dataclass(frozen=True)
class Mark:
    """Where a queue's doorbell stood: the pushes heard so far, and whether it listened then."""

    pushes: int
    listening: bool


#: The mark of a consumer without a doorbell (Redis publishes no events): never listening.
DEAF = Mark(0, False)


class Doorbell:
    """One subscription per process to the keyspace channels of every queue its consumers serve.

    Its thread reads the events: a push onto a queue's list rings that queue (its count of pushes
    grows and its consumer wakes); so does a subscription confirmed, and a lost connection rings
    every queue, since what was pushed while nobody listened is found only by a fetch. It reads all the time, so
    events never pile up in Redis, and it pings after ``ping_s`` of silence, so a connection that
    died without a word is found."""

    def __init__(self, client: redis.Redis, *, ping_s: float = PING_S) -> None:
        self.client, self.ping_s = client, ping_s
        self.lock = threading.Lock()
        self.pushes: dict[bytes, int] = {}
        self.bells: dict[bytes, threading.Condition] = {}
        self.listening: set[bytes] = set()
        self.lost = False
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        #: Consumers open per channel: the subscription lives while any is open.
        self.watchers: dict[bytes, int] = {}
        #: Threads told to stop when their last consumer closed, joined by ``stop``.
        self.retired: list[threading.Thread] = []

    def watch(self, channel: bytes) -> None:
        """Subscribe to ``channel`` too (within ``READ_S``); the thread starts with the first."""
        with self.lock:
            if channel not in self.pushes:
                self.pushes[channel], self.bells[channel] = 0, threading.Condition(self.lock)
            self.watchers[channel] = self.watchers.get(channel, 0) + 1
            if self.thread is None:
                self.stopping = threading.Event()  # the thread's own: a stopped one never sees its successor's
                self.thread = threading.Thread(target=self._run, args=(self.stopping,), name="doorbell",
                                               daemon=True)
                self.thread.start()

    def unwatch(self, channel: bytes) -> None:
        """A consumer of ``channel`` closed; with the last consumer gone the subscription ends (a worker
        that stopped listens no more), and the next ``watch`` starts it again."""
        with self.lock:
            self.watchers[channel] = max(0, self.watchers.get(channel, 0) - 1)
            if any(self.watchers.values()) or self.thread is None:
                return
            self.stopping.set()
            self.retired.append(self.thread)
            self.thread = None

    def mark(self, channel: bytes) -> Mark:
        with self.lock:
            return Mark(self.pushes[channel], channel in self.listening)

    def wait(self, channel: bytes, mark: Mark, seconds: float) -> bool:
        """Until ``channel`` rings after ``mark``, at most ``seconds``: whether it rang."""
        deadline = time.monotonic() + seconds
        with self.lock:
            while Mark(self.pushes[channel], channel in self.listening) == mark:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.bells[channel].wait(left)
            return True

    def lose(self) -> None:
        """A consumer's command failed (a failover): subscribe anew, wherever the client points now."""
        with self.lock:
            self.lost = True

    def stop(self) -> None:
        with self.lock:
            threads = [t for t in (self.thread, *self.retired) if t is not None]
            self.thread, self.retired = None, []
            self.stopping.set()
        for thread in threads:
            thread.join(timeout=READ_S * 8)

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                self._listen(stopping)
            except (redis.RedisError, OSError) as error:
                log.debug("keyspace events unavailable (%s): consumers poll until subscribed again", error)
            with self.lock:
                self.listening.clear()
                for bell in self.bells.values():
                    bell.notify_all()
            stopping.wait(RESUBSCRIBE_S)

    def _listen(self, stopping: threading.Event) -> None:
        events = self.client.pubsub()
        subscribed: set[bytes] = set()
        heard, pinged = time.monotonic(), False
        with self.lock:
            self.lost = False
        try:
            while not stopping.is_set():
                with self.lock:
                    if self.lost:
                        raise redis.ConnectionError("a consumer lost the broker")
                    new = [channel for channel in self.pushes if channel not in subscribed]
                if new:
                    events.subscribe(*new)
                    subscribed.update(new)
                event = events.get_message(timeout=READ_S)
                now = time.monotonic()
                if event is not None:
                    heard, pinged = now, False
                    self._hear(event)
                elif now - heard > self.ping_s:
                    if pinged:
                        raise redis.TimeoutError(f"no answer to a ping in {self.ping_s:g} s")
                    events.ping()
                    heard, pinged = now, True
        finally:
            events.close()

    def _hear(self, event: dict[str, Any]) -> None:
        channel = event.get("channel")
        with self.lock:
            if channel not in self.bells:  # a pong
                return
            if event["type"] == "subscribe":
                # Pushes reach us from here on. It rings too: redis-py subscribes again by itself
                # on a new connection, and what was pushed in between only a fetch finds.
                self.listening.add(channel)
            elif event["type"] != "message" or event["data"] not in PUSHES:
                return
            self.pushes[channel] += 1
            self.bells[channel].notify_all()


#: reckon's dispatch script for Dramatiq's Redis broker: the same calls, fewer commands (its header).
DISPATCH = (Path(__file__).resolve().parents[2] / "lua" / "broker.lua").read_bytes()


class WakingRedisBroker(RedisBroker):
    """Dramatiq's Redis broker with one ``Doorbell`` per process for its consumers, reckon's own
    dispatch script (lua/broker.lua: enqueue 2 commands, fetch 3, ack 2, and the process's heartbeat
    at most every quarter of its timeout), and no delay queues (reckon delays nothing in the
    broker: a retry waits in the state's due set)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.scripts["dispatch"] = self.client.register_script(DISPATCH)
        self.doorbell = Doorbell(self.client)
        #: Whether Redis publishes the list events (checked at the first consume; None: not yet).
        self.events: bool | None = None
        self._maintain = threading.local()
        #: When this process last wrote its heartbeat (monotonic s; lua/broker.lua writes it when asked).
        self._beaten = float("-inf")

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> dramatiq.Consumer:
        if self.events is None:
            self.events = self._check_events()
        return WakingConsumer(self, queue_name, prefetch, timeout)

    def _check_events(self) -> bool:
        """Whether Redis publishes the events an idle consumer waits for (said once when not)."""
        try:
            flags = self.client.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
        except redis.RedisError:  # CONFIG refused (a managed Redis): it may still publish them
            return True
        flags = flags.decode() if isinstance(flags, bytes) else flags
        if "K" in flags and {"l", "A"} & set(flags):
            return True
        log.warning("Redis does not publish list keyspace events (notify-keyspace-events Kl): "
                    "idle workers poll their queues and may take up to a second to pick a job up")
        return False

    def declare_queue(self, queue_name: str) -> None:
        """Declare ``queue_name`` without its delay queue (``<queue>.DQ``): Dramatiq's Worker runs a
        consumer for each declared delay queue, five more per process, fetching from lists that never
        hold a message."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def enqueue(self, message: dramatiq.Message, *, delay: int | None = None) -> dramatiq.Message:
        """Send ``message`` now; a delay is refused, since no consumer serves a delay queue."""
        if delay is not None:
            raise ValueError("reckon's Redis broker has no delay queues: a message is sent now or not at all")
        return super().enqueue(message)

    def enqueue_many(self, messages: list[dramatiq.Message]) -> None:
        """``enqueue`` of each message, in one pipeline (a batch's jobs: pipeline/state/batching.py)."""
        dispatch, sent = self.scripts["dispatch"], []
        with self.client.pipeline(transaction=False) as pipe:
            for message in messages:
                message = message.copy(options={"redis_message_id": str(uuid4())})
                self.emit_before("enqueue", message, None)
                dispatch(keys=[self.namespace], client=pipe, args=[
                    "enqueue", current_millis(), message.queue_name, self.broker_id, self.heartbeat_timeout,
                    self.dead_message_ttl, self._should_do_maintenance("enqueue"), self._max_unpack_size(),
                    message.options["redis_message_id"], message.encode()])
                sent.append(message)
            pipe.execute()
        for message in sent:
            self.emit_after("enqueue", message, None)

    def fetch(self, queue_name: str, count: int, *, maintain: bool) -> list[bytes]:
        """Dramatiq's fetch of up to ``count`` messages; ``maintain``: with its maintenance pass on this
        queue (requeue dead workers' messages, expire dead letters), else as ``maintenance_chance`` says.
        It writes the process's heartbeat when one is due (``_beat_due``)."""
        self._maintain.now = maintain
        beat = self._beat_due()
        try:
            fetched = list(self.do_fetch(queue_name, count, "1" if beat else ""))
        finally:
            self._maintain.now = False
        if beat:  # written: only a call that succeeded counts as a heartbeat
            self._beaten = time.monotonic()
        return fetched

    def heartbeat(self, queue_name: str) -> None:
        """Write the process's heartbeat if one is due (a consumer that holds as many messages as it
        may, so fetches none)."""
        if self._beat_due():
            self.do_heartbeat(queue_name)
            self._beaten = time.monotonic()

    def _beat_due(self) -> bool:
        """Whether a heartbeat is due: a quarter of the timeout since the last one written."""
        return time.monotonic() - self._beaten >= self.heartbeat_timeout / 1000 / RECHECK_SHARE

    def _should_do_maintenance(self, command: str) -> int:
        return 1 if getattr(self._maintain, "now", False) else int(super()._should_do_maintenance(command))

    def close(self) -> None:
        self.doorbell.stop()
        super().close()


class WakingConsumer(_RedisConsumer):
    """A Redis consumer that, once a fetch found its queue empty, fetches again only when a push has
    come since (the doorbell rang: at once), when its recheck is due, or, while nothing listens, after
    Dramatiq's poll back-off. A fetch that brings fewer messages than asked found the queue empty."""

    def __init__(self, broker: WakingRedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self.waker = broker
        db = broker.client.connection_pool.connection_kwargs.get("db", 0)
        self.channel = f"__keyspace@{db}__:{broker.namespace}:{queue_name}".encode()
        self.doorbell = broker.doorbell if broker.events else None
        if self.doorbell is not None:
            self.doorbell.watch(self.channel)
        self.recheck_s = broker.heartbeat_timeout / 1000 / RECHECK_SHARE
        #: The doorbell's mark before the last fetch, if that fetch found the queue empty (None: fetch).
        self.emptied: Mark | None = None
        self.fetched_at = self.maintained_at = time.monotonic()

    def close(self) -> None:
        """The worker stops this consumer: its queue's subscription goes with the process's last one."""
        if self.doorbell is not None:
            self.doorbell.unwatch(self.channel)
            self.doorbell = None
        super().close()

    def __next__(self) -> Any:
        """A message, or None at least every worker timeout (the worker checks whether to stop)."""
        if not self.message_cache and self.outstanding_message_count >= self.prefetch:
            self.waker.heartbeat(self.queue_name)  # busy with all it may hold: alive all the same
        if not self.message_cache and self.outstanding_message_count < self.prefetch:
            if self.emptied is not None and not self._rung():
                return None
            self._fetch(self.prefetch - self.outstanding_message_count)
            if not self.message_cache:
                self.misses += 1
                return None
        # Dramatiq's own: the next message from the cache or, with as many taken as allowed (their
        # acks come through the worker, not Redis), its back-off and None.
        return super().__next__()

    def _fetch(self, count: int) -> None:
        mark = self.doorbell.mark(self.channel) if self.doorbell is not None else DEAF
        now = time.monotonic()
        maintain = now - self.maintained_at >= self.broker.heartbeat_timeout / 1000
        try:
            self.message_cache = self.waker.fetch(self.queue_name, count, maintain=maintain)
        except redis.ConnectionError as error:
            if self.doorbell is not None:
                self.doorbell.lose()
            raise ConnectionClosed(error) from None
        self.fetched_at = now
        self.maintained_at = now if maintain else self.maintained_at
        self.emptied = mark if len(self.message_cache) < count else None

    def _rung(self) -> bool:
        """After a fetch that found the queue empty: whether to fetch again now."""
        mark, idle_s = self.emptied, self.timeout / 1000
        assert mark is not None
        if self.doorbell is None or not mark.listening:  # poll, or fetch as soon as it listens
            _, backoff_ms = compute_backoff(max(0, self.misses - 1), max_backoff=self.timeout)
            if self.doorbell is None:
                time.sleep(backoff_ms / 1000)
            else:
                self.doorbell.wait(self.channel, mark, backoff_ms / 1000)
            return True
        recheck_s = self.fetched_at + self.recheck_s - time.monotonic()
        return self.doorbell.wait(self.channel, mark, max(0.0, min(idle_s, recheck_s))) or recheck_s <= idle_s
