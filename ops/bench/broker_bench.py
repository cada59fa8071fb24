#!/usr/bin/env python3
"""The broker's limit: no-op messages per second through Dramatiq's broker, built as reckon builds it.

Run: ``.venv/bin/python ops/bench/broker_bench.py --messages 20000 --threads 1,8``
(``--broker amqp`` measures a private rabbitmq-server instead; ``--appendfsync everysec`` relaxes
ops/redis.conf's fsync on every write).
Starts its own redis-server (ops/redis.conf: AOF, fsync always, as deployed) on a free loopback port,
builds the broker with ``pipeline.work.broker.build_broker`` and, for each thread count N, measures:
  enqueue:  ``--publishers`` threads publishing messages shaped like reckon's (a job id), back to back;
  drain:    one Dramatiq worker process with N threads consuming and acking that backlog;
  sustained: the same worker consuming while this process publishes (time until the last ack);
and, for Redis, redis-server's CPU per message (used_cpu_user + used_cpu_sys) in each phase, which
gives the ceiling of one Redis core: 1 s / CPU per message.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import free_port, wait_for  # noqa: E402
from pipeline.settings import Settings
from pipeline.work.broker import build_broker

QUEUE, ACTOR = "reckon-bench", "noop"


def message(i: int) -> dramatiq.Message:
    """The shape of every reckon message: one job id, no options."""
    return dramatiq.Message(queue_name=QUEUE, actor_name=ACTOR, args=(f"01J{i:023d}",), kwargs={}, options={})


def worker_main(url: str, threads: int, expect: int) -> None:
    """Child mode: consume ``expect`` messages with ``threads`` threads, print first/last ack times."""
    broker = build_broker(dataclasses.replace(Settings(), broker_url=url))
    dramatiq.set_broker(broker)
    done: list[float] = []

    @dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE)
    def noop(job_id: str) -> None:
        done.append(time.time())  # list.append is atomic under the GIL

    worker = dramatiq.Worker(broker, worker_threads=threads)
    worker.start()
    print("ready", flush=True)
    while len(done) < expect:
        time.sleep(0.005)
    print(f"done {min(done)} {max(done)}", flush=True)
    worker.stop()
    broker.close()


@contextlib.contextmanager
def redis_broker(appendfsync: str) -> Iterator[tuple[str, redis.Redis]]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="reckon-broker-bench-") as work:
        server = subprocess.Popen(["redis-server", str(ROOT / "ops/redis.conf"), "--port", str(port), "--dir", work,
                                   "--save", "", "--appendfsync", appendfsync], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=port)
        try:
            wait_for(client.ping)
            yield f"redis://127.0.0.1:{port}/1", client
        finally:
            client.close()
            server.terminate()
            server.wait(timeout=10)


def redis_cpu(client: redis.Redis | None) -> float:
    if client is None:
        return 0.0
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Run:
    def __init__(self, url: str, client: redis.Redis | None, messages: int, publishers: int) -> None:
        self.url, self.client, self.messages, self.publishers = url, client, messages, publishers
        self.broker = build_broker(dataclasses.replace(Settings(), broker_url=url))

    def enqueue(self, offset: int) -> tuple[float, float]:
        """Publish the messages; returns (seconds, Redis CPU seconds)."""
        cpu, start = redis_cpu(self.client), time.time()

        def publish(first: int) -> None:
            for i in range(first, offset + self.messages, self.publishers):
                self.broker.enqueue(message(i))

        threads = [threading.Thread(target=publish, args=(offset + k,)) for k in range(self.publishers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.time() - start, redis_cpu(self.client) - cpu

    def start_worker(self, threads: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", self.url, str(threads), str(self.messages)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("broker_bench: the worker did not start")
        return proc

    def finish(self, proc: subprocess.Popen[str]) -> tuple[float, float]:
        assert proc.stdout is not None
        _, first, last = proc.stdout.readline().split()
        proc.wait(timeout=60)
        return float(first), float(last)

    def threads(self, n: int, round_: int) -> None:
        m = self.messages
        seconds, cpu = self.enqueue(round_ * 2 * m)
        self.report(f"N={n:<3} enqueue ({self.publishers} publisher threads)", m, seconds, cpu)
        cpu, proc = redis_cpu(self.client), self.start_worker(n)
        first, last = self.finish(proc)
        self.report(f"N={n:<3} drain backlog (1 worker process, {n} threads)", m, last - first,
                    redis_cpu(self.client) - cpu)
        proc = self.start_worker(n)
        cpu, start = redis_cpu(self.client), time.time()
        self.enqueue(round_ * 2 * m + m)
        _, last = self.finish(proc)
        self.report(f"N={n:<3} sustained enqueue + consume", m, last - start, redis_cpu(self.client) - cpu)

    def report(self, label: str, m: int, seconds: float, cpu: float) -> None:
        line = f"{label:<56} {m / seconds:8.0f} msg/s"
        if self.client is not None:
            per = cpu / m * 1e6
            line += f"   redis CPU {per:6.1f} us/msg (one core's ceiling {1e6 / per:7.0f} msg/s)"
        print(line, flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000, help="messages per phase")
    parser.add_argument("--threads", default="1,8", help="worker thread counts, comma-separated")
    parser.add_argument("--publishers", type=int, default=4, help="publishing threads (one connection each)")
    parser.add_argument("--broker", choices=["redis", "amqp"], default="redis")
    parser.add_argument("--appendfsync", choices=["always", "everysec", "no"], default="always")
    args = parser.parse_args()
    with backend(args.broker, args.appendfsync) as (url, client):
        run = Run(url, client, args.messages, args.publishers)
        for round_, n in enumerate(int(t) for t in args.threads.split(",")):
            run.threads(n, round_)


@contextlib.contextmanager
def backend(kind: str, appendfsync: str) -> Iterator[tuple[str, redis.Redis | None]]:
    """The broker's URL, and a client for its redis-server's figures (None for RabbitMQ)."""
    if kind == "amqp":
        from ops.bench.rabbitmq import private_rabbitmq

        with private_rabbitmq() as url:
            print("broker: Dramatiq RabbitmqBroker (publisher confirms, persistent messages)")
            yield url, None
        return
    with redis_broker(appendfsync) as (url, client):
        print(f"broker: Dramatiq RedisBroker, ops/redis.conf with appendfsync {appendfsync}")
        yield url, client

if __name__ == "__main__":
    main()
