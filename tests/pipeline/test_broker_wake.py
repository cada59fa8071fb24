"""An idle Redis consumer wakes on its queue's keyspace event, and polls as Dramatiq does without it."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis

from pipeline.work.waking import WakingRedisBroker
from tests.conftest import REDIS_PORT, free_port, wait_until


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[int]:
    """A redis-server of this test alone (its port), stopped by its PID: the tests that count the
    server's commands or its subscribers must not see the suite's other brokers (the actors' broker
    keeps its subscription for the whole session)."""
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                             "--notify-keyspace-events", "Kl"], stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: _answers(port))
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except redis.ConnectionError:
        return False


def message(n: int) -> dramatiq.Message:
    return dramatiq.Message(queue_name="wake-test", actor_name="noop", args=(f"job-{n}",), kwargs={}, options={})


def two_brokers(client: redis.Redis) -> tuple[WakingRedisBroker, WakingRedisBroker]:
    """Two worker processes' brokers on one Redis: one namespace, the test queue declared."""
    first, second = (WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0) for _ in range(2))
    for broker in (first, second):
        broker.declare_queue("wake-test")
    return first, second


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
        broker.close()
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
        broker.close()
        client.close()


def fetches(client: redis.Redis) -> int:
    """Dramatiq's dispatch calls so far (every fetch, enqueue and ack is one EVALSHA)."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


#: What a client sends when it opens a connection (redis-py: ``CLIENT SETINFO`` twice, ``SELECT``; ``HELLO``
#: with RESP3), and ``INFO`` itself: not a message's cost. A connection opens when two threads need the
#: pool at once, as when a fetch the enqueue's keyspace event woke starts before the enqueue's thread has
#: read its reply: a matter of timing.
NOT_COUNTED = {"cmdstat_info", "cmdstat_hello", "cmdstat_select", "cmdstat_client|setinfo", "cmdstat_client|setname"}


def commands(client: redis.Redis) -> int:
    """Every command Redis ran so far, those inside scripts included (``NOT_COUNTED`` left out)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name not in NOT_COUNTED)


def listening(broker: WakingRedisBroker, queue: str = "wake-test") -> bool:
    return broker.doorbell.mark(f"__keyspace@1__:waketest:{queue}".encode()).listening


def test_a_consumer_that_emptied_its_queue_fetches_only_when_a_push_comes(own_redis: int) -> None:
    client = redis.Redis(port=own_redis, db=1)
    # nothing that comes with time within the test, however slow the machine: no recheck or heartbeat
    # before 150 s (a quarter of the heartbeat timeout), no maintenance pass, no ping
    broker = WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0, heartbeat_timeout=600_000)
    broker.doorbell.ping_s = 600
    broker.declare_queue("wake-test")
    consumer = broker.consume("wake-test", prefetch=4, timeout=200)
    try:
        wait_until(lambda: listening(broker))
        assert next(consumer) is None  # the fetch that finds the queue empty, now that it listens
        before, total = fetches(client), commands(client)
        for _ in range(8):  # 8 worker timeouts idle: each ends in None, none fetches
            assert next(consumer) is None
        assert fetches(client) == before
        timer = threading.Timer(0.3, broker.enqueue, args=(message(3),))
        timer.start()
        started = time.monotonic()
        got = first_message(consumer)
        timer.join()
        assert got.args == ("job-3",)
        assert time.monotonic() - started < 60  # the push, not the 150 s recheck
        assert fetches(client) == before + 2  # the enqueue and one fetch (it brought 1 of 4: the queue is empty)
        consumer.ack(got)
        assert next(consumer) is None
        assert fetches(client) == before + 3  # the ack; no fetch after the message
        # the message's whole cost (lua/broker.lua): enqueue 2 (EVALSHA, RPUSH), fetch 3 (EVALSHA, one
        # LPOP of up to 4, HSET of what it holds; the heartbeat went with the first fetch, under a
        # quarter of its timeout ago), ack 2 (EVALSHA, HDEL), and nothing else: no subscription, no
        # length check, no empty fetch
        assert commands(client) == total + 7
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_after_its_subscription_is_killed_a_consumer_polls_then_listens_again(own_redis: int) -> None:
    client = redis.Redis(port=own_redis, db=1)
    broker = WakingRedisBroker(client=client, namespace="waketest")
    broker.declare_queue("wake-test")
    consumer = broker.consume("wake-test", prefetch=4, timeout=200)
    try:
        wait_until(lambda: listening(broker))
        assert next(consumer) is None
        assert client.client_kill_filter(_type="pubsub") == 1
        broker.enqueue(message(4))  # while nothing listens
        got = first_message(consumer, limit_s=5)
        assert got.args == ("job-4",)
        consumer.ack(got)
        wait_until(lambda: listening(broker))  # subscribed anew
        while next(consumer) is not None:
            pass
        before = fetches(client)
        for _ in range(3):
            assert next(consumer) is None
        assert fetches(client) == before  # listening again: no polling
        broker.enqueue(message(5))
        assert first_message(consumer, limit_s=5).args == ("job-5",)
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_an_idle_consumer_redelivers_a_dead_workers_message_without_the_maintenance_chance(redis_server: str) -> None:
    """Dramatiq's maintenance runs on one dispatch in a thousand; an idle consumer makes few, so it runs
    a pass on its queue at least once per heartbeat timeout (here 2 s), and its recheck keeps its own
    heartbeat fresh."""
    client = redis.Redis(port=REDIS_PORT, db=1)
    options = {"client": client, "namespace": "waketest", "heartbeat_timeout": 2000, "maintenance_chance": 0}
    dead, alive = WakingRedisBroker(**options), WakingRedisBroker(**options)
    for broker in (dead, alive):
        broker.declare_queue("wake-test")
    consumer = alive.consume("wake-test", prefetch=4, timeout=200)
    try:
        wait_until(lambda: listening(alive))
        assert next(consumer) is None
        dead.enqueue(message(6))
        assert len(dead.do_fetch("wake-test", 1)) == 1  # then its worker dies holding it
        assert client.llen("waketest:wake-test") == 0
        started = time.monotonic()
        got = first_message(consumer, limit_s=15)
        assert got.args == ("job-6",)
        assert 2 <= time.monotonic() - started < 10  # past the dead one's heartbeat timeout, within ~2 more
        consumer.ack(got)
        assert client.hlen("waketest:wake-test.msgs") == 0
        heartbeat_ms = client.zscore("waketest:__heartbeats__", alive.broker_id)
        assert heartbeat_ms is not None and time.time() * 1000 - heartbeat_ms < 2000
    finally:
        alive.flush_all()
        for broker in (dead, alive):
            broker.close()
        client.close()


def test_one_subscription_serves_every_queue_of_a_process_and_pings_when_silent(own_redis: int) -> None:
    client = redis.Redis(port=own_redis, db=1)
    broker = WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0)
    broker.doorbell.ping_s = 0.3
    for queue in ("wake-test", "wake-other"):
        broker.declare_queue(queue)
    mine, other = broker.consume("wake-test", prefetch=4, timeout=200), broker.consume("wake-other", 4, 200)
    try:
        wait_until(lambda: listening(broker) and listening(broker, "wake-other"))
        assert [c["name"] for c in client.client_list(_type="pubsub")] == [""]  # one connection for both
        assert next(mine) is None and next(other) is None
        pings = int(client.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))
        before = fetches(client)
        broker.enqueue(message(7).copy(queue_name="wake-other"))
        assert next(mine) is None  # another queue's push does not ring this one
        assert first_message(other, limit_s=5).args == ("job-7",)
        assert fetches(client) == before + 2  # the enqueue and the other queue's fetch
        # silent: the doorbell pings (every 0.3 s without an event) and still listens
        wait_until(lambda: int(client.info("commandstats")["cmdstat_ping"]["calls"]) - pings >= 2, timeout=30)
        assert listening(broker) and listening(broker, "wake-other")
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_the_subscription_ends_with_the_last_consumer_and_starts_again_with_the_next(own_redis: int) -> None:
    """A worker that stopped (its consumers closed) keeps no subscription: nothing of it pings Redis
    any more. A consumer opened later subscribes again and wakes on a push."""
    client = redis.Redis(port=own_redis, db=1)
    broker = WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0)
    broker.declare_queue("wake-test")
    first, second = broker.consume("wake-test", prefetch=4, timeout=200), broker.consume("wake-test", 4, 200)
    try:
        wait_until(lambda: listening(broker))
        first.close()
        assert len(client.client_list(_type="pubsub")) == 1  # the other consumer still listens
        second.close()
        wait_until(lambda: client.client_list(_type="pubsub") == [], timeout=5)
        again = broker.consume("wake-test", prefetch=4, timeout=200)
        wait_until(lambda: listening(broker) and len(client.client_list(_type="pubsub")) == 1)
        assert next(again) is None  # the fetch that finds the queue empty, now that it listens
        broker.enqueue(message(9))
        started = time.monotonic()
        assert first_message(again, limit_s=5).args == ("job-9",)
        assert time.monotonic() - started < 5  # woken by the push, not the 15 s recheck
        again.close()
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_reckons_dispatch_script_keeps_dramatiqs_calls(own_redis: int) -> None:
    """lua/broker.lua answers Dramatiq's calls as its own script does: a fetch takes up to its count in
    order and holds them for the worker, an ack drops one, a nack dead-letters one, a requeue puts one
    back, qsize counts what waits and what is held; an enqueue writes no heartbeat."""
    client = redis.Redis(port=own_redis, db=1)
    broker = WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0)
    broker.declare_queue("wake-test")
    ids = [broker.enqueue(message(n)).options["redis_message_id"] for n in range(5)]
    try:
        assert client.zcard("waketest:__heartbeats__") == 0  # enqueues write none
        held = [dramatiq.Message.decode(raw).args for raw in broker.fetch("wake-test", 3, maintain=False)]
        assert held == [("job-0",), ("job-1",), ("job-2",)]
        holding = f"waketest:__held__.{broker.broker_id}.wake-test"
        assert [item.split(b" ", 1)[0] for item in client.lrange("waketest:wake-test", 0, -1)] == [
            i.encode() for i in ids[3:]]
        assert sorted(client.hkeys(holding)) == sorted(i.encode() for i in ids[:3])
        assert client.zscore("waketest:__heartbeats__", broker.broker_id) is not None  # the first fetch's
        broker.do_ack("wake-test", ids[0])
        broker.do_nack("wake-test", ids[1])
        broker.do_requeue("wake-test", ids[2])
        assert client.hlen(holding) == 0
        assert client.zrange("waketest:wake-test.XQ", 0, -1) == [ids[1].encode()]
        assert client.hkeys("waketest:wake-test.XQ.msgs") == [ids[1].encode()]
        assert [item.split(b" ", 1)[0] for item in client.lrange("waketest:wake-test", 0, -1)] == [
            i.encode() for i in (ids[3], ids[4], ids[2])]
        assert broker.do_qsize("wake-test") == 3
        again = [dramatiq.Message.decode(raw).args for raw in broker.fetch("wake-test", 8, maintain=False)]
        assert again == [("job-3",), ("job-4",), ("job-2",)] and broker.fetch("wake-test", 8, maintain=False) == []
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_messages_an_earlier_versions_script_stored_are_fetched_acked_and_redelivered(own_redis: int) -> None:
    """A queue written by Dramatiq's own script (ids in the list, messages in ``<queue>.msgs``, fetched ids in
    a worker's ``__acks__`` set) is read by lua/broker.lua: fetched, acked, and a dead worker's put back."""
    client = redis.Redis(port=own_redis, db=1)
    broker = WakingRedisBroker(client=client, namespace="waketest", maintenance_chance=0,
                               heartbeat_timeout=1000)
    broker.declare_queue("wake-test")
    old = [message(n) for n in range(3)]
    for m in old:
        m.options["redis_message_id"] = m.message_id
        client.hset("waketest:wake-test.msgs", m.message_id, m.encode())
    client.rpush("waketest:wake-test", old[0].message_id, old[1].message_id)
    client.sadd("waketest:__acks__.gone.wake-test", old[2].message_id)  # held by a worker that died
    client.zadd("waketest:__heartbeats__", {"gone": 1})
    try:
        got = [dramatiq.Message.decode(raw) for raw in broker.fetch("wake-test", 8, maintain=False)]
        assert [m.args for m in got] == [("job-0",), ("job-1",)]
        broker.do_ack("wake-test", old[0].message_id)
        assert client.hkeys(f"waketest:__held__.{broker.broker_id}.wake-test") == [old[1].message_id.encode()]
        assert client.hkeys("waketest:wake-test.msgs") == [old[2].message_id.encode()]
        back = [dramatiq.Message.decode(raw).args for raw in broker.fetch("wake-test", 8, maintain=True)]
        assert back == [("job-2",)]  # the dead worker's, put back by the maintenance pass
        assert client.zscore("waketest:__heartbeats__", "gone") is None
        assert client.exists("waketest:__acks__.gone.wake-test", "waketest:wake-test.msgs") == 0
    finally:
        broker.flush_all()
        broker.close()
        client.close()


def test_a_worker_holding_messages_without_a_heartbeat_is_dead_to_maintenance(own_redis: int) -> None:
    """A worker dropped from the heartbeats while it was silent (it held nothing then), back and fetching
    before its next heartbeat was due, then dead: its held message still comes back in a maintenance
    pass. A heartbeat counts only once written: a failed call leaves the next one due."""
    client = redis.Redis(port=own_redis, db=1)
    worker, other = two_brokers(client)
    try:
        real = worker.scripts["dispatch"]

        def unreachable(*args, **kwargs):
            raise redis.ConnectionError("the broker did not answer")

        worker.scripts["dispatch"] = unreachable
        with pytest.raises(redis.ConnectionError):
            worker.fetch("wake-test", 4, maintain=False)
        assert worker._beat_due()  # not written: still due
        worker.scripts["dispatch"] = real
        sent = other.enqueue(message(7)).options["redis_message_id"]
        assert len(worker.fetch("wake-test", 4, maintain=False)) == 1
        assert client.zscore("waketest:__heartbeats__", worker.broker_id) is not None
        client.zrem("waketest:__heartbeats__", worker.broker_id)  # dropped meanwhile; the worker dies now
        back = [dramatiq.Message.decode(raw).options["redis_message_id"]
                for raw in other.fetch("wake-test", 4, maintain=True)]
        assert back == [sent]
        assert client.exists(f"waketest:__held__.{worker.broker_id}.wake-test") == 0
    finally:
        other.flush_all()
        client.close()


def test_a_worker_whose_clock_is_behind_is_not_taken_for_dead(own_redis: int, monkeypatch) -> None:
    """Every time in lua/broker.lua is Redis's: a host whose clock is two minutes behind writes a fresh
    heartbeat, and a maintenance pass leaves what it holds with it."""
    client = redis.Redis(port=own_redis, db=1)
    lagging, other = two_brokers(client)
    try:
        other.enqueue(message(8))
        import dramatiq.brokers.redis as dramatiq_redis
        monkeypatch.setattr(dramatiq_redis, "current_millis", lambda: int(time.time() * 1000) - 120_000)
        assert len(lagging.fetch("wake-test", 4, maintain=False)) == 1
        monkeypatch.undo()
        redis_ms = int(client.time()[0]) * 1000
        assert abs(client.zscore("waketest:__heartbeats__", lagging.broker_id) - redis_ms) < 10_000
        assert other.fetch("wake-test", 4, maintain=True) == []  # nothing taken back from it
        assert client.hlen(f"waketest:__held__.{lagging.broker_id}.wake-test") == 1
    finally:
        other.flush_all()
        lagging.flush_all()
        client.close()
