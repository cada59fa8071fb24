#!/usr/bin/env python3
"""The capacity model's figures, per job: Redis commands and CPU, broker messages, bytes kept, process CPU.

Run: ``.venv/bin/python ops/bench/capacity.py --jobs 1000 --concurrency 8``.
Starts, on 127.0.0.1 free ports: a state redis-server and a separate broker redis-server (both
ops/redis.conf: AOF, fsync always; deployed, they are one server's databases 0 and 1: add the two),
the simulated provider (``--delay``, default 0), gunicorn (ops/gunicorn.conf.py), the watcher and one
Dramatiq worker process (``--threads``). Once the worker polls its queues, it resets both servers'
statistics, reads every process group's CPU time (/proc), admits ``--jobs`` jobs through gunicorn
while the worker runs them, waits until all are finished, and prints the deltas per job:
  - state Redis: commands (``INFO commandstats``, those run inside scripts included), CPU ms
    (``INFO cpu`` used_cpu_user + used_cpu_sys), bytes kept per finished job within retention
    (``MEMORY USAGE`` summed over every key, and the ``INFO memory`` used_memory delta);
  - broker Redis: round trips (EVALSHA of Dramatiq's dispatch.lua), messages enqueued (each
    enqueue runs one RPUSH inside it) and acked (each ack one HDEL), CPU ms;
  - CPU ms per job of the API (gunicorn, all its workers), the Dramatiq worker process, the watcher.
Each figure's ceiling on one core is 1000 / (CPU ms per job) jobs/s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import Stack, calls, finished, free_port, http_ok, post_jobs, redis_cpu, wait_for  # noqa: E402
from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import create_key, create_tenant


def key_bytes(client: redis.Redis) -> int:
    """Sum of ``MEMORY USAGE`` (every element sampled) over all keys of the database."""
    total = 0
    batch: list[str] = []
    for key in [*client.scan_iter(count=1000), None]:
        if key is not None:
            batch.append(key)
        if len(batch) == 500 or (key is None and batch):
            pipe = client.pipeline(transaction=False)
            for name in batch:
                pipe.memory_usage(name, samples=0)
            total += sum(size or 0 for size in pipe.execute())
            batch.clear()
    return total


#: One call of Dramatiq's dispatch.lua as MONITOR prints it: its command and queue.
DISPATCH = re.compile(r'"EVALSHA" "\w+" "1" "dramatiq" "(enqueue|ack|nack)" "\d+" "([^"]+)"')


@contextlib.contextmanager
def monitor(client: redis.Redis, path: Path) -> Iterator[collections.Counter[tuple[str, str]]]:
    """``redis-cli MONITOR`` on the broker while the block runs; yields (command, queue) -> calls,
    filled when the block ends. MONITOR costs the server CPU: use it in a run of its own."""
    port = client.connection_pool.connection_kwargs["port"]
    counted: collections.Counter[tuple[str, str]] = collections.Counter()
    with open(path, "w") as out:
        proc = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=out)
    try:
        yield counted
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        with open(path) as lines:
            counted.update(m.groups() for m in map(DISPATCH.search, lines) if m)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8, help="client connections")
    parser.add_argument("--threads", type=int, default=8, help="Dramatiq worker threads (one process)")
    parser.add_argument("--cap", type=int, default=8, help="RECKON_PROVIDER_CAP: prompts in flight at the provider")
    parser.add_argument("--appendfsync", choices=["always", "everysec"], default="always",
                        help="both servers' AOF fsync (ops/redis.conf: always)")
    parser.add_argument("--monitor-broker", action="store_true",
                        help="also count the broker's messages per queue with MONITOR (raises its CPU figure)")
    parser.add_argument("--delay", type=float, default=0.0, help="simulated provider's seconds per prompt")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="reckon-capacity-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, work: Path) -> None:
    """Start the processes in ``work``, measure, and stop them by PID."""
    sport, bport, wport, pport = free_port(), free_port(), free_port(), free_port()
    env = os.environ | {
        "RECKON_REDIS_URL": f"redis://127.0.0.1:{sport}/0", "RECKON_BROKER_URL": f"redis://127.0.0.1:{bport}/1",
        "RECKON_PROVIDER_URL": f"http://127.0.0.1:{pport}", "RECKON_BLOB_DIR": str(work / "blobs"),
        "RECKON_POLL_INTERVAL_SECONDS": "0.01", "PORT": str(wport), "RECKON_PROVIDER_CAP": str(args.cap),
        "RECKON_WATCH_POLL_SECONDS": "0.1",
    }
    stack = Stack(env)
    state, broker = redis.Redis(port=sport, decode_responses=True), redis.Redis(port=bport, db=1)
    try:
        for name, port in (("state-redis", sport), ("broker-redis", bport)):
            (work / name).mkdir()
            stack.start(name, "redis-server", "ops/redis.conf", "--port", str(port), "--dir", str(work / name),
                        "--appendfsync", args.appendfsync)
        wait_for(state.ping)
        wait_for(broker.ping)
        stack.start("provider", str(BIN / "python"), "-m", "pipeline.providers.sim", "--port", str(pport),
                    "--delay", str(args.delay))
        stack.start("api", str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()")
        stack.start("watcher", str(BIN / "python"), "-m", "pipeline.work.watcher")
        stack.start("worker", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                    "--processes", "1", "--threads", str(args.threads))
        wait_for(lambda: http_ok(wport, "/readyz"))
        wait_for(lambda: broker.zcard("dramatiq:__heartbeats__") > 0)  # the worker fetches from its queues
        time.sleep(2)  # every consumer thread up
        create_tenant(state, "bench", 10**12)
        api_key = create_key(state, "bench")
        if not args.monitor_broker:
            measure(args, stack, state, broker, wport, api_key)
            return
        with monitor(broker, work / "broker-monitor.txt") as per_queue:
            measure(args, stack, state, broker, wport, api_key)
        for (command, queue), count in sorted(per_queue.items()):
            print(f"  broker {command:<8} {queue:<20} {count / args.jobs:5.2f}/job")
    finally:
        state.close()
        broker.close()
        stack.stop()


def measure(args: argparse.Namespace, stack: Stack, state: redis.Redis, broker: redis.Redis, wport: int,
            api_key: str) -> None:
    n = args.jobs
    for server in (state, broker):
        server.config_resetstat()
    cpu0, state_cpu0, broker_cpu0 = stack.cpu(), redis_cpu(state), redis_cpu(broker)
    memory0, keys0 = int(state.info("memory")["used_memory"]), key_bytes(state)
    started = time.perf_counter()
    post_jobs(wport, api_key, [f"cap-{i}" for i in range(n)], args.concurrency)
    wait_for(lambda: finished(state) == n, timeout=1200)
    elapsed = time.perf_counter() - started
    cpu1, state_calls, broker_calls = stack.cpu(), calls(state), calls(broker)
    state_cpu, broker_cpu = redis_cpu(state) - state_cpu0, redis_cpu(broker) - broker_cpu0
    memory, keys = int(state.info("memory")["used_memory"]) - memory0, key_bytes(state) - keys0
    counts = state.hgetall(TenantKeys("bench").counts)
    dead = sum(broker.zcard(key) for key in broker.scan_iter("dramatiq:*.XQ"))

    print(f"{n} jobs admitted through gunicorn ({args.concurrency} connections) and run by 1 worker process "
          f"({args.threads} threads), provider delay {args.delay} s, cap {args.cap}, appendfsync {args.appendfsync}: "
          f"{elapsed:.1f} s, "
          f"{n / elapsed:.1f} jobs/s; {counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed")
    top = sorted(state_calls.items(), key=lambda kv: -kv[1])[:6]
    print(f"state Redis:  {sum(state_calls.values()) / n:6.1f} commands/job (top: "
          + ", ".join(f"{name} {c / n:.1f}" for name, c in top) + ")")
    print(f"              {state_cpu / n * 1000:6.3f} CPU ms/job -> one core's ceiling "
          f"{n / state_cpu:6.0f} jobs/s")
    print(f"              {keys / n:6.0f} bytes kept per finished job within retention (MEMORY USAGE of all keys; "
          f"used_memory delta {memory / n:.0f})")
    enqueued, acked = broker_calls.get("rpush", 0), broker_calls.get("hdel", 0) - dead
    print(f"broker Redis: {enqueued / n:6.2f} messages enqueued/job, {acked / n:.2f} acked/job, "
          f"{dead} dead-lettered; {broker_calls.get('evalsha', 0) / n:.1f} round trips/job "
          f"({sum(broker_calls.values()) / n:.1f} commands/job with those inside dispatch.lua)")
    print(f"              {broker_cpu / n * 1000:6.3f} CPU ms/job -> one core's ceiling "
          f"{n / broker_cpu:6.0f} jobs/s")
    for name in ("api", "worker", "watcher", "provider"):
        used = cpu1[name] - cpu0[name]
        print(f"{name + ':':<13} {used / n * 1000:6.3f} CPU ms/job -> one core's ceiling "
              f"{n / used if used else float('inf'):6.0f} jobs/s")


if __name__ == "__main__":
    main()
