"""Helpers the benchmark scripts share: free loopback ports, waiting for a process, a private
redis-server, posting jobs through the API, and what the phases of ops/bench/bench.py share (``Bench``)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import redis

from pipeline.state.keys import ShardKeys, TenantKeys
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes in process group ``pgid``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in client.info("commandstats").items()}


class Stack:
    """The processes, each leading its own process group, stopped by PID on exit."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> None:
        """Start ``argv`` as ``name`` in its own session, with the stack's environment plus ``env``."""
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env | (env or {}), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def cpu(self) -> dict[str, float]:
        return {name: group_cpu(proc.pid) for name, proc in self.procs.items()}

    def stop(self, *names: str) -> None:
        """Stop the named processes (all when none is named) and forget them."""
        procs = [self.procs.pop(name) for name in (names or list(self.procs))]
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float = 30.0, what: str = "bench: a process did not come up",
             interval: float = 0.05) -> None:
    """Until ``check()`` is true (a connection refused or a Redis error counts as false), asked every
    ``interval`` seconds; else exit with ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, redis.RedisError):
            pass
        time.sleep(interval)
    raise SystemExit(what)


@contextlib.contextmanager
def private_store(config: Path | None = None) -> Iterator[Store]:
    """A Store over a private redis-server (AOF off) on a free loopback port, stopped on exit; with
    ``config`` (e.g. ops/redis.conf: its listpack bounds, as deployed) read from that file first."""
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(["redis-server", *([str(config)] if config else []), "--port", str(port),
                                   "--bind", "127.0.0.1", "--dir", workdir,
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


def shard_totals(client: redis.Redis, shards: int, *fields: str) -> list[int]:
    """Each of ``fields`` of the shards' figures (their ``stats`` hashes), summed over the shards."""
    pipe = client.pipeline(transaction=False)
    for n in range(shards):
        pipe.hmget(ShardKeys(n).stats, *fields)
    return [sum(int(values[i] or 0) for values in pipe.execute()) for i in range(len(fields))]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


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


@dataclass
class Bench:
    """What the phases of ops/bench/bench.py share: the options, the processes, reckon's environment, the
    private redis-server (database 0 reckon's state, database 1 the broker) and a scratch directory."""

    args: argparse.Namespace
    stack: Stack
    env: dict[str, str]
    port: int
    work: Path

    @property
    def shards(self) -> int:
        return int(self.env.get("RECKON_SHARDS", "1"))

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def start_web(self, name: str, app: str) -> int:
        """gunicorn with ops/gunicorn.conf.py (its default workers and threads) serving ``app`` on a free
        loopback port, once it answers ``/healthz``; the port."""
        port = free_port()
        self.stack.start(name, str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", app, env={"PORT": str(port)})
        wait_for(lambda: http_ok(port, "/healthz"))
        return port


def in_threads(work: Callable[[Any], None], shares: list[Any]) -> None:
    """``work(share)`` for each share at once, a thread each; back once every one has returned."""
    threads = [threading.Thread(target=work, args=(share,)) for share in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
