"""``Prefer: wait`` at a thousand waiters: a private redis-server, the web process and the streams process
(ops/gunicorn.conf.py, ops/streams.conf.py; no worker), ``--jobs`` jobs admitted through the scripts and left
queued, and one ``GET /v1/jobs/{id}`` with ``Prefer: wait=60`` held for each on the streams process by this
process (asyncio, one socket each).

It reports the streams process's RSS before and with the waiters held (per waiter), the Redis commands per
second over ``--hold`` seconds of waiting (``INFO commandstats`` delta, per waiter), and, once this process
ends the jobs through the scripts (claim, an output, finish: ``--rate`` a second), the delay from each job's
``completed`` event (its ``at``, Redis's clock) to its answer's arrival here (p50, p99, max); then how many of
``--web`` waits sent at once to the web process it held (the rest answered at once without
``Preference-Applied``).

    PYTHONPATH=. .venv/bin/python ops/bench/waiters.py --jobs 1000 --hold 20 --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from ops.bench.benchlib import BIN, wait_for
from ops.bench.deployed import Deployed, _get, total_calls, workflow
from ops.bench.streams import pct, rss_kb
from pipeline.settings import Settings
from pipeline.state import progress
from pipeline.state.store import open_store
from pipeline.state.submit import Admitter


def up(stack: Deployed) -> None:
    """Redis, the web process and the streams process: nothing runs the jobs but this tool."""
    stack.start("redis", "redis-server", "ops/redis.conf", "--port", str(stack.redis_port), "--dir", str(stack.work),
                "--appendonly", "no", "--save", "")
    wait_for(stack.client.ping)
    stack.start("web", str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()")
    wait_for(lambda: _get(stack.web_port, "/readyz") == 200, timeout=30)
    stack.start("streams", str(BIN / "gunicorn"), "-c", "ops/streams.conf.py", "api.streams.app:create_app()")
    wait_for(lambda: _get(stack.streams_port, "/healthz") == 200, timeout=30)


async def wait_one(port: int, key: str, job_id: str, seconds: int, answers: dict[str, Any]) -> None:
    """One held GET; its arrival (s since the epoch), status, Preference-Applied and state into ``answers``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /v1/jobs/{job_id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                     f"Prefer: wait={seconds}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status = await reader.readline()
        arrived = time.time()
        raw = await reader.read()
        head, _, body = raw.partition(b"\r\n\r\n")
        applied = b"preference-applied: wait=" in head.lower()
        answers[job_id] = (arrived, int(status.split()[1]), applied, orjson.loads(body)["state"])
    finally:
        writer.close()


def hold(port: int, key: str, job_ids: list[str], seconds: int, answers: dict[str, Any]) -> threading.Thread:
    """Every wait, in an event loop of a thread of its own (started now; the thread ends with the last answer)."""
    async def every() -> None:
        await asyncio.gather(*(wait_one(port, key, job_id, seconds, answers) for job_id in job_ids))

    thread = threading.Thread(target=asyncio.run, args=(every(),), daemon=True)
    thread.start()
    return thread


def held_connections(port: int) -> int:
    """Established connections to ``port`` (from /proc/net/tcp: state 01)."""
    hexport = f":{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[1].endswith(hexport) and line.split()[3] == "01")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds of waiting over which commands are counted")
    parser.add_argument("--rate", type=int, default=200, help="jobs a second ended through the scripts")
    parser.add_argument("--web", type=int, default=20, help="waits sent at once to the web process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reckon-waiters-") as tmp:
        stack = Deployed(Path(tmp), cap=1000, env={"RECKON_STREAMS_MAX_STREAMS": str(args.jobs + 100)})
        try:
            up(stack)
            key = stack.tenant("bench")
            settings = Settings.from_env(stack.env)
            store = open_store(settings, check=False)
            admitter = Admitter(store, lambda job_id, queue: None, settings)
            body = {"kind": "image", "workflow": workflow(256), "outputs": 1, "priority": "batch"}
            job_ids = [admitter.submit("bench", f"wait-{n}", body).job_id for n in range(args.jobs + args.web)]
            time.sleep(2)
            rss0 = rss_kb(stack.procs["streams"].pid)
            answers: dict[str, Any] = {}
            thread = hold(stack.streams_port, key, job_ids[:args.jobs], 60, answers)
            wait_for(lambda: held_connections(stack.streams_port) >= args.jobs, timeout=60)
            time.sleep(2)
            calls0, t0 = total_calls(stack.client), time.perf_counter()
            time.sleep(args.hold)
            waited = time.perf_counter() - t0
            per_s = (total_calls(stack.client) - calls0 - 1) / waited
            rss1 = rss_kb(stack.procs["streams"].pid)
            assert not answers, f"{len(answers)} answered before their job ended"
            t1 = time.perf_counter()
            for n, job_id in enumerate(job_ids[:args.jobs]):
                claim = store.claim(job_id, worker="bench", lease_ms=60_000, operation_id=f"op-{n}",
                                    servers={"sim0": 1000})
                assert claim is not None
                store.store_output(claim, 0, {"sha256": "a" * 64})
                store.finish(claim, "completed")
                time.sleep(max(0.0, t1 + (n + 1) / args.rate - time.perf_counter()))
            thread.join(90)
            delays = []
            for job_id, (arrived, status, applied, state) in answers.items():
                assert (status, applied, state) == (200, True, "completed"), (status, applied, state)
                (done,) = [e for e in progress.events_after(store.redis, job_id) if e.get("to") == "completed"]
                delays.append((arrived - done["at"] / 1000) * 1000)
            web: dict[str, Any] = {}
            hold(stack.web_port, key, job_ids[args.jobs:], 2, web).join(30)
            web_held = sum(1 for _, _, applied, _ in web.values() if applied)
            print(f"waiters {args.jobs} on one streams process (1 uvicorn worker), held {waited:.0f} s")
            print(f"streams process RSS {rss0 / 1024:.1f} MB -> {rss1 / 1024:.1f} MB:"
                  f" {(rss1 - rss0) / args.jobs:.1f} kB a waiter")
            print(f"Redis commands/s while they wait: {per_s:.2f} ({per_s / args.jobs:.4f} a waiter)")
            print(f"{len(delays)} answered 200 completed; completion -> answer p50 {pct(delays, 50):.1f} ms"
                  f" p99 {pct(delays, 99):.1f} ms max {max(delays):.1f} ms (ended at {args.rate}/s)")
            print(f"web process: {web_held} of {args.web} waits sent at once held; the rest answered at once")
        finally:
            stack.down()


if __name__ == "__main__":
    main()
