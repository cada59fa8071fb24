#!/usr/bin/env python3
"""Benchmark reckon on this machine: admission through gunicorn, end-to-end jobs, Redis commands per job.

Run: ``make bench`` (or ``.venv/bin/python ops/bench.py --jobs 400 --concurrency 16``).
Starts a private redis-server (ops/redis.conf: AOF, fsync always), gunicorn, a Dramatiq
worker, the watcher and the simulated provider (zero delay), all on 127.0.0.1 free ports, and stops them.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from pipeline.keys import TenantKeys  # noqa: E402
from pipeline.redisconn import connect_url  # noqa: E402
from pipeline.store import Store  # noqa: E402
from pipeline.tenants import create_key, create_tenant  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, redis.RedisError):
            pass
        time.sleep(0.05)
    raise SystemExit("bench: a process did not come up")


@contextlib.contextmanager
def private_store() -> Iterator[Store]:
    """A Store over a private redis-server (AOF off) on a free loopback port, stopped on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
                                   "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            store = Store(connect_url(f"redis://127.0.0.1:{port}/0"))
            wait_for(lambda: store.redis.ping())
            yield store
        finally:
            server.terminate()
            server.wait(timeout=10)


def post_jobs(port: int, api_key: str, keys: list[str], concurrency: int) -> list[float]:
    """POST one job per key over keep-alive connections; returns each request's latency (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    body = orjson.dumps({"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1})

    def run(share: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        for key in share:
            start = time.perf_counter()
            conn.request("POST", "/v1/jobs", body, {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key,
                                                     "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 202:
                raise SystemExit(f"bench: admission answered {resp.status}")
            mine.append(time.perf_counter() - start)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(keys[i::concurrency],)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400, help="jobs per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="client connections")
    parser.add_argument("--cap", type=int, default=8, help="RECKON_PROVIDER_CAP: prompts in flight at the provider")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="reckon-bench-"))
    rport, wport, sport = free_port(), free_port(), free_port()
    env = os.environ | {
        "RECKON_REDIS_URL": f"redis://127.0.0.1:{rport}/0", "RECKON_BROKER_URL": f"redis://127.0.0.1:{rport}/1",
        "RECKON_PROVIDER_URL": f"http://127.0.0.1:{sport}", "RECKON_BLOB_DIR": str(work / "blobs"),
        "RECKON_POLL_INTERVAL_SECONDS": "0.01", "PORT": str(wport), "RECKON_PROVIDER_CAP": str(args.cap),
        "RECKON_WATCH_POLL_SECONDS": "0.1",
    }
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> None:
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))

    client = redis.Redis(port=rport, decode_responses=True)
    try:
        start("redis-server", "ops/redis.conf", "--port", str(rport), "--dir", str(work))
        wait_for(client.ping)
        start(str(BIN / "python"), "-m", "pipeline.providers.sim", "--port", str(sport), "--delay", "0")
        start(str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()")
        wait_for(lambda: http_ok(wport, "/readyz"))
        create_tenant(client, "bench", 10**12)
        api_key = create_key(client, "bench")

        # 1. Admission alone (no workers running): requests per second and latency.
        started = time.perf_counter()
        latencies = post_jobs(wport, api_key, [f"adm-{i}" for i in range(args.jobs)], args.concurrency)
        elapsed = time.perf_counter() - started
        q = statistics.quantiles(latencies, n=100)
        print(f"admission: {args.jobs} requests, concurrency {args.concurrency}: {args.jobs / elapsed:.0f} req/s, "
              f"p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms")

        # 2. End to end: drain the admitted backlog with one Dramatiq worker process, then count commands.
        client.config_resetstat()
        started = time.perf_counter()
        start(str(BIN / "python"), "-m", "pipeline.watcher")
        start(str(BIN / "dramatiq"), "pipeline.actors", "--processes", "1", "--threads", "8")
        wait_for(lambda: finished(client) == args.jobs, timeout=600)
        elapsed = time.perf_counter() - started
        stats = client.info("commandstats")
        calls = sum(v["calls"] for v in stats.values())
        print(f"end to end: {args.jobs} jobs in {elapsed:.1f} s: {args.jobs / elapsed:.1f} jobs/s "
              "(1 worker process, 8 threads, provider delay 0; includes worker start-up)")
        top = sorted(stats.items(), key=lambda kv: -kv[1]["calls"])[:6]
        print(f"redis commands per job (worker + broker, admission excluded): {calls / args.jobs:.1f} (top: "
              + ", ".join(f"{name.removeprefix('cmdstat_')} {v['calls'] / args.jobs:.1f}" for name, v in top) + ")")
        ledger = client.hgetall(TenantKeys("bench").ledger)
        counts = client.hgetall(TenantKeys("bench").counts)
        print(f"jobs: {counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed; "
              f"ledger: settled {ledger['settled']}, reserved {ledger['reserved']}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def finished(client: redis.Redis) -> int:
    counts = client.hgetall(TenantKeys("bench").counts)
    return int(counts.get("completed", 0)) + int(counts.get("failed", 0))


def http_ok(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()


if __name__ == "__main__":
    main()
