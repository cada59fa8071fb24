"""Event streams at a thousand watchers: the deployed stack (ops/bench/deployed.py ``Deployed``, the streams
process included) and ``--streams`` tenant streams held open by this process (asyncio, one socket each,
spread over ``--tenants`` tenants).

It reports the streams process's RSS before and after they open (per stream), the Redis commands per
second of the idle stack with and without them (``INFO commandstats`` delta over ``--hold`` seconds) and
what the streams process's re-check of their ``--keys`` API keys costs in them (its MGETs: calls and
microseconds of Redis CPU a second),
event latency (an event's ``at`` to its receipt here) while admissions and cancels of ``--rate`` jobs a
second run through the scripts directly (two events a job, each to every stream of its tenant), and
``POST /v1/jobs`` latency (p50, p99 of ``--posts`` sequential posts, from a process of their own so the
watchers' thread takes no interpreter time from them) before, with and after the streams open.

    PYTHONPATH=. .venv/bin/python ops/bench/streams.py --streams 1000 --hold 60 --rate 100 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import multiprocessing
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import orjson
import redis

from ops.bench.deployed import Deployed, completed, total_calls, workflow
from pipeline.state.tenants import create_key

BODY = orjson.dumps({"kind": "image", "workflow": workflow(1024), "outputs": 1})


def rss_kb(pid: int) -> int:
    """Resident memory of a process and its children (the gunicorn master and its worker), kB."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        total += rss_kb(int(child))
    return total


def post_latencies(port: int, api_key: str, n: int, tag: str) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/jobs", BODY, {"Authorization": f"Bearer {api_key}", "Idempotency-Key": f"{tag}-{i}",
                                                "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        took.append((time.perf_counter() - t0) * 1000)
        assert resp.status == 202, resp.status
    conn.close()
    return took


def mget_stats(client: redis.Redis) -> tuple[int, int]:
    """MGET calls and microseconds of Redis CPU so far (the streams process's key re-check; nothing else of
    the idle stack sends one)."""
    stats = client.info("commandstats").get("cmdstat_mget", {})
    return stats.get("calls", 0), stats.get("usec", 0)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else (values or [0.0])[0]


class Watchers:
    """``count`` tenant streams in an event loop of their own thread; each event's latency recorded."""

    def __init__(self, port: int, keys: list[str], count: int) -> None:
        self.port, self.keys, self.count = port, keys, count
        self.open, self.latencies, self.recording = 0, [], False
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.tasks = [asyncio.run_coroutine_threadsafe(self.follow(keys[i % len(keys)]), self.loop)
                      for i in range(count)]

    async def follow(self, key: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"GET /v1/events/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
                         .encode())
            await writer.drain()
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            self.open += 1
            while line := await reader.readline():
                if line.startswith(b"data: {") and self.recording:
                    at = orjson.loads(line[6:])["at"]
                    sent = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
                    self.latencies.append((time.time() - sent) * 1000)
        finally:
            writer.close()

    def close(self) -> None:
        """Every stream closed (its socket too), then the loop stopped."""
        async def end() -> None:
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)

        asyncio.run_coroutine_threadsafe(end(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def posts_apart(port: int, api_key: str, n: int, tag: str) -> list[float]:
    """``post_latencies`` in a process of its own."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(post_latencies, (port, api_key, n, tag))


def drive(stack: Deployed, tenants: list[str], rate: int, seconds: float) -> int:
    """Admissions and cancels through the scripts at ``rate`` jobs a second; the jobs driven."""
    from pipeline.settings import Settings
    from pipeline.state.store import open_store
    from pipeline.state.submit import Admitter

    settings = Settings.from_env(stack.env)
    store = open_store(settings, check=False)
    admitter = Admitter(store, lambda job_id, queue: None, settings)
    body = {"kind": "image", "workflow": workflow(256), "outputs": 1}
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        job_id = admitter.submit(tenants[n % len(tenants)], f"drive-{n}", body).job_id
        store.cancel(job_id)
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.perf_counter()))
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--keys", type=int, default=0, help="API keys the streams use, spread over the tenants"
                        " (default: one a tenant)")
    parser.add_argument("--hold", type=float, default=60.0, help="seconds the idle streams are held")
    parser.add_argument("--rate", type=int, default=100, help="jobs a second driven through the scripts")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long they are driven")
    parser.add_argument("--posts", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reckon-streams-") as tmp:
        stack = Deployed(Path(tmp), cap=1000, env={"RECKON_STREAMS_MAX_STREAMS": str(args.streams + 100)})
        try:
            stack.up()
            names = [f"t{i}" for i in range(args.tenants)]
            keys = [stack.tenant(name) for name in names]
            keys += [create_key(stack.client, names[i % args.tenants]) for i in range(args.tenants, args.keys)]
            post_latencies(stack.web_port, keys[0], 20, "warm")
            time.sleep(3)
            without = posts_apart(stack.web_port, keys[0], args.posts, "without")
            while completed(stack.client, names[0]) < 20 + args.posts:  # idle means these jobs are done
                time.sleep(0.2)
            time.sleep(3)
            calls0, t0 = total_calls(stack.client), time.perf_counter()
            time.sleep(args.hold)
            idle_without = (total_calls(stack.client) - calls0 - 1) / (time.perf_counter() - t0)
            rss0 = rss_kb(stack.procs["streams"].pid)
            watchers = Watchers(stack.streams_port, keys, args.streams)
            while watchers.open < args.streams:
                time.sleep(0.1)
            calls0, t0, mget0 = total_calls(stack.client), time.perf_counter(), mget_stats(stack.client)
            time.sleep(args.hold)
            mget1, held = mget_stats(stack.client), time.perf_counter() - t0
            idle_with = (total_calls(stack.client) - calls0 - 1) / held
            rss1 = rss_kb(stack.procs["streams"].pid)
            with_streams = posts_apart(stack.web_port, keys[0], args.posts, "with")
            watchers.recording = True
            jobs = drive(stack, names, args.rate, args.seconds)
            time.sleep(2)
            watchers.recording = False
            lat = watchers.latencies
            print(f"streams {args.streams} over {args.tenants} tenants, held {args.hold:.0f} s")
            print(f"streams process RSS {rss0 / 1024:.1f} MB -> {rss1 / 1024:.1f} MB:"
                  f" {(rss1 - rss0) / args.streams:.1f} kB a stream")
            print(f"idle Redis commands/s: {idle_without:.2f} without streams, {idle_with:.2f} with")
            print(f"re-check of the streams' {len(keys)} keys: {(mget1[0] - mget0[0]) / held:.2f} MGET/s,"
                  f" {(mget1[1] - mget0[1]) / held:.0f} us/s of Redis CPU")
            print(f"driven {jobs} jobs in {args.seconds:.0f} s ({jobs / args.seconds:.0f}/s),"
                  f" {len(lat)} events received: latency p50 {pct(lat, 50):.1f} ms p99 {pct(lat, 99):.1f} ms"
                  f" max {max(lat or [0]):.1f} ms")
            watchers.close()
            time.sleep(3)
            after = posts_apart(stack.web_port, keys[0], args.posts, "after")
            print(f"POST /v1/jobs p50/p99 ms: before the streams {pct(without, 50):.1f}/{pct(without, 99):.1f},"
                  f" with {pct(with_streams, 50):.1f}/{pct(with_streams, 99):.1f},"
                  f" after {pct(after, 50):.1f}/{pct(after, 99):.1f}")
        finally:
            stack.down()


if __name__ == "__main__":
    main()
