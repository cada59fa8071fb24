"""Webhook delivery latency: from a job's state change to its receipt, p50 and p99, idle and under load.

A private redis-server, the ``webhooks`` process (``python -m pipeline.webhooks.sender``, default settings
but ``RECKON_WEBHOOK_ALLOW_PRIVATE=1``) and a receiver on loopback in this process. A driver admits jobs
through the real admission (``pipeline.state.submit.Admitter``, no broker: nothing runs them) and cancels
each at once: the cancel is the state change, ``job.cancelled`` the event. Latency is the receipt's time
minus the event's time (Redis's clock, ms; one machine, one clock). Idle: one job every 100 ms; load:
``--rate`` jobs a second (cancels too, so twice that many state changes) for ``--seconds``.

``--noisy`` then measures one tenant's latency beside another's slow endpoints: tenant ``noisy`` gets 16
endpoints on a receiver that answers 200 after 4 s ("slow"), then 16 that never answer (the sender's
timeout ends each try: "hanging"), and 20 jobs' events for each (320 deliveries); meanwhile 200 of
``bench``'s jobs at 20 a second, whose latency compares with that of 200 at 20 a second alone, just before.

``--backlog N`` then measures what an endpoint that is down costs Redis: ``used_memory`` after N jobs
whose every ``job.cancelled`` delivery waits for an endpoint that refuses connections, less ``used_memory``
after N jobs with no endpoint, per delivery.

    PYTHONPATH=. .venv/bin/python ops/bench/webhooks.py [--rate 200] [--seconds 10] [--noisy] [--backlog 5000]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import redis

from ops.bench.benchlib import BIN, ROOT, free_port, wait_for
from pipeline.settings import Settings
from pipeline.state.keys import ShardKeys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.webhooks.endpoints import MAX_ENDPOINTS, Endpoints

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}, "outputs": 1}


def answer_ok(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A quiet threading HTTP server of ``handler`` on a free loopback port, serving from a daemon thread."""
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Receiver:
    def __init__(self) -> None:
        latencies, lock = self.latencies, self.lock = [], threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                now = time.time()
                at = datetime.fromisoformat(orjson.loads(body)["timestamp"].replace("Z", "+00:00")).timestamp()
                with lock:
                    latencies.append(now - at)
                answer_ok(self)

        self.server = serve(Handler)

    def take(self) -> list[float]:
        with self.lock:
            out, self.latencies[:] = list(self.latencies), []
        return out


def drive(admitter: Admitter, store: Store, prefix: str, count: int, rate: float, tenant: str = "bench") -> None:
    """``count`` jobs of ``tenant`` admitted and cancelled at ``rate`` a second, from 4 threads."""
    def share(offset: int) -> None:
        start = time.monotonic()
        for i in range(offset, count, 4):
            delay = start + i / rate - time.monotonic() - offset / rate
            if delay > 0:
                time.sleep(delay)
            job_id = admitter.submit(tenant, f"{prefix}-{i}", BODY).job_id
            store.cancel(job_id)

    threads = [threading.Thread(target=share, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class Stalling:
    """A receiver on loopback that answers 200 after ``seconds``, or never (None) until it is closed; it
    counts the requests it got."""

    def __init__(self, seconds: float | None) -> None:
        self.closed, self.got = threading.Event(), list[int]()
        closed, got = self.closed, self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got.append(1)
                if closed.wait(seconds):
                    return
                answer_ok(self)

        self.server = serve(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


def noisy(store: Store, admitter: Admitter, receiver: Receiver, name: str, seconds: float | None,
          stalled: int = MAX_ENDPOINTS) -> None:
    """Prints bench's latency (200 jobs at 20 a second) while tenant noisy's ``stalled`` endpoints stall (see
    the module's docstring); noisy's endpoints are removed after, their deliveries with them."""
    stalling, endpoints = Stalling(seconds), Endpoints(store)
    ids = [endpoints.add("noisy", f"{stalling.url}/{i}", ["job.cancelled"])[0]["id"] for i in range(stalled)]
    try:
        drive(admitter, store, f"noisy-{name}", 20 if stalled else 0, 1_000, tenant="noisy")
        receiver.take()
        drive(admitter, store, f"beside-{name}", 200, 20)
        wait_for(lambda: len(receiver.latencies) >= 200, timeout=120)
        got = receiver.take()
        print(f"beside {stalled} {name} endpoints of another tenant ({20 * stalled} deliveries; "
              f"{len(stalling.got)} of their requests made): 200 jobs at 20 jobs/s: latency p50 "
              f"{1000 * percentile(got, 0.5):.1f} ms, p99 {1000 * percentile(got, 0.99):.1f} ms, "
              f"max {1000 * max(got):.1f} ms")
    finally:
        for endpoint in ids:
            endpoints.remove("noisy", endpoint)
        stalling.close()


def backlog(client: redis.Redis, store: Store, admitter: Admitter, count: int) -> None:
    """Prints the bytes a delivery kept for a down endpoint costs Redis (see the module's docstring)."""
    endpoints = Endpoints(store)
    for endpoint in endpoints.all("bench"):
        endpoints.remove("bench", endpoint["id"])

    def grown(prefix: str, kept: int) -> int:
        before = int(client.info("memory")["used_memory"])
        drive(admitter, store, prefix, count, 1_000)
        wait_for(lambda: client.hlen(ShardKeys(0).webhook_deliveries) >= kept and not client.llen(
            ShardKeys(0).webhook_outbox) and not client.llen(ShardKeys(0).webhook_taking), timeout=120)
        return int(client.info("memory")["used_memory"]) - before

    bare = grown("bare", 0)
    endpoints.add("bench", f"http://127.0.0.1:{free_port()}/down", ["job.cancelled"])  # nothing listens there
    down = grown("down", count)
    print(f"backlog: {count} jobs without an endpoint {bare / count:.0f} bytes a job; with a down endpoint "
          f"{down / count:.0f}: {(down - bare) / count:.0f} bytes a delivery kept")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--noisy", action="store_true", help="latency beside another tenant's stalling endpoints")
    parser.add_argument("--backlog", type=int, default=0, help="deliveries kept for a down endpoint, measured")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="reckon-webhooks-") as work:
        redis_proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                                       "--dir", work], stdout=subprocess.DEVNULL, start_new_session=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECKON_")} | {
            "RECKON_REDIS_URL": f"redis://127.0.0.1:{port}/0", "RECKON_WEBHOOK_ALLOW_PRIVATE": "1"}
        sender = None
        try:
            client = redis.Redis(port=port, decode_responses=True)
            wait_for(client.ping)
            store = Store(client)
            store.scripts.load()
            create_tenant(client, "bench", 10**12)
            create_tenant(client, "noisy", 10**12)
            receiver = Receiver()
            Endpoints(store).add("bench", f"http://127.0.0.1:{receiver.server.server_address[1]}/hook",
                                 ["job.cancelled"])
            log = open(Path(work) / "webhooks.log", "ab")
            sender = subprocess.Popen([str(BIN / "python"), "-m", "pipeline.webhooks.sender"], cwd=ROOT, env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            admitter = Admitter(store, lambda *_: None, Settings.from_env(env))
            drive(admitter, store, "warm", 10, 50)
            wait_for(lambda: len(receiver.latencies) >= 10, timeout=30)
            receiver.take()
            for name, count, rate in (("idle", 50, 10), ("load", int(args.rate * args.seconds), args.rate)):
                t0 = time.monotonic()
                drive(admitter, store, name, count, rate)
                achieved = count / (time.monotonic() - t0)
                wait_for(lambda: len(receiver.latencies) >= count, timeout=120)
                got = receiver.take()
                print(f"{name}: {count} jobs at {achieved:.0f} jobs/s ({2 * achieved:.0f} state changes/s): "
                      f"latency p50 {1000 * percentile(got, 0.5):.1f} ms, p99 {1000 * percentile(got, 0.99):.1f} ms,"
                      f" max {1000 * max(got):.1f} ms")
            if args.noisy:
                noisy(store, admitter, receiver, "(alone)", None, stalled=0)
                for name, seconds in (("slow (4 s)", 4.0), ("hanging", None)):
                    noisy(store, admitter, receiver, name, seconds)
            if args.backlog:
                backlog(client, store, admitter, args.backlog)
        finally:
            for proc in (sender, redis_proc):
                if proc is not None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=20)


if __name__ == "__main__":
    main()
