#!/usr/bin/env python3
"""Soak reckon: thousands of jobs through every provider fault and process crash, then check every promise.

Run: ``.venv/bin/python ops/soak/soak.py [--short] [--jobs 2000] [--json report.json]``. Starts its own
redis-server (ops/redis.conf: AOF, fsync always, private dir), the simulated provider, gunicorn,
N Dramatiq workers and the sweeper, all on 127.0.0.1 free ports, and stops each by process group.
While clients admit jobs (retrying with the same idempotency key through outages), it injects
provider faults, SIGKILLs and SIGSTOPs workers, kills the API and restarts Redis. Then it waits
for every job to come to rest and checks the promises (ops/soak/soak_check.py); exit status 0 only
if every check passes.
"""

from __future__ import annotations

import argparse
import http.client
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import redis

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

import soak_check as checks  # noqa: E402

from ops.soak.chaos import Chaos, Faults  # noqa: E402
from ops.soak.stack import Stack, request, wait_for  # noqa: E402
from pipeline.state.keys import JobKeys, TenantKeys, use_shards
from pipeline.state.tenants import create_key, create_tenant


class Load:
    """Client threads: admit every job (same key on every retry), replay some, cancel some."""

    def __init__(self, port: int, api_keys: dict[str, str], opts: argparse.Namespace, rng: random.Random) -> None:
        self.port, self.api_keys, self.opts = port, api_keys, opts
        self.jobs = [(f"t{i % len(api_keys)}", f"soak-{i}", orjson.dumps({
            "kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": i}}},
            "outputs": rng.randint(1, 3), "priority": rng.choice(["interactive", "batch"])}))
            for i in range(opts.jobs)]
        self.dups = set(rng.sample(range(opts.jobs), int(opts.jobs * opts.dup_rate)))
        self.cancels = set(rng.sample(range(opts.jobs), int(opts.jobs * opts.cancel_rate)))
        self.accepted: dict[str, str] = {}
        self.mismatched: list[dict[str, str]] = []
        self.cancelled: set[str] = set()
        self.stats: Counter[str] = Counter()
        self.lock = threading.Lock()

    def call(self, method: str, path: str, tenant: str, body: bytes | None = None,
             key: str | None = None) -> tuple[int, dict[str, str], bytes]:
        """One logical request, retried through outages (same idempotency key) until it has an answer."""
        headers = {"Authorization": f"Bearer {self.api_keys[tenant]}", "Content-Type": "application/json"}
        headers |= {"Idempotency-Key": key} if key else {}
        give_up = time.monotonic() + self.opts.request_timeout
        while True:
            try:
                status, resp_headers, data = request(self.port, method, path, body, headers)
                self.stats[f"{method} {status}"] += 1
                if status not in (409, 429, 500, 502, 503, 504) or (status == 409 and not key):
                    return status, resp_headers, data
            except (OSError, http.client.HTTPException):  # refused, reset, or cut mid-answer (API killed)
                self.stats[f"{method} connection error"] += 1
            if time.monotonic() > give_up:
                return 0, {}, b""
            time.sleep(0.2)

    def submit(self, index: int) -> str | None:
        tenant, key, body = self.jobs[index]
        status, headers, data = self.call("POST", "/v1/jobs", tenant, body, key)
        if status != 202:
            self.stats[f"admission gave up ({status})"] += 1
            return None
        job_id = orjson.loads(data)["id"]
        with self.lock:
            first = self.accepted.setdefault(key, job_id)
            self.stats["replayed"] += headers.get("idempotent-replayed") == "true"
            if first != job_id:
                self.mismatched.append({"key": key, "first": first, "again": job_id})
        return job_id

    def cancel(self, index: int) -> None:
        tenant, key, _ = self.jobs[index]
        job_id = self.accepted.get(key)
        if job_id:
            status = self.call("POST", f"/v1/jobs/{job_id}/cancel", tenant)[0]
            self.stats[f"cancel {status}"] += 1
            if status in (200, 202):
                with self.lock:
                    self.cancelled.add(job_id)

    def run(self, share: range, later: list[int]) -> None:
        for i in share:
            if self.submit(i) and i in self.cancels and i % 2:
                self.cancel(i)  # at once: usually still queued
        for i in later:
            if i in self.dups:
                self.submit(i)  # another thread's job, maybe while it is still being admitted
            if i in self.cancels and not i % 2:
                self.cancel(i)  # later: maybe running

    def progress(self) -> float:
        return len(self.accepted) / max(1, len(self.jobs))


def code_version() -> str:
    """The commit under test, and whether the working tree differs from it (read without taking git's lock)."""
    git = ["git", "--no-optional-locks", "-C", str(ROOT)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           check=False)
    return f"{head.stdout.strip() or 'unknown'}{'+dirty' if dirty.stdout.strip() else ''}"


def states(client: checks.Client, tenants: list[str]) -> list[str]:
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        for job_id in client.zrange(TenantKeys(tenant).jobs, 0, -1):
            pipe.hget(JobKeys(job_id).record, "state")
    return pipe.execute()


def at_rest_fraction(client: checks.Client, tenants: list[str], total: int) -> float:
    try:
        counts = [client.hgetall(TenantKeys(t).counts) for t in tenants]
    except redis.RedisError:
        return 0.0
    return sum(int(n) for c in counts for s, n in c.items() if s in checks.AT_REST) / max(1, total)


def wait_at_rest(client: checks.Client, tenants: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(s in checks.AT_REST for s in states(client, tenants)):
                return True
        except redis.RedisError:
            pass
        time.sleep(0.25)
    return False


def admit(load: Load, clients: int) -> None:
    n = len(load.jobs)
    shares = [range(i, n, clients) for i in range(clients)]
    threads = [threading.Thread(target=load.run, args=(shares[i], list(shares[(i + 1) % clients])), daemon=True)
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def soak(stack: Stack, opts: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Admit and drain under faults and chaos; returns the report (checks included)."""
    tenants = [f"t{i}" for i in range(opts.tenants)]
    for tenant in tenants:
        create_tenant(stack.client, tenant, 10**9)
    load = Load(stack.web_port, {t: create_key(stack.client, t) for t in tenants}, opts, rng)
    t0 = time.monotonic()
    sampler = checks.LedgerSampler(stack.client, tenants)
    faults = Faults(stack, opts.fault_rate, random.Random(f"{opts.seed}:faults"), until=t0 + opts.chaos_seconds)
    chaos = Chaos(stack, opts, random.Random(f"{opts.seed}:chaos"), lambda: {"admitted": load.progress(),
                                             "drained": at_rest_fraction(stack.client, tenants, opts.jobs)})
    background: list[Any] = [sampler, faults, chaos]
    for thread in background:
        thread.start()
    try:
        admit(load, opts.clients)
        admitted = time.monotonic() - t0
        rested = wait_at_rest(stack.client, tenants, opts.timeout)
    finally:
        for thread in background:
            thread.stop.set()
        for thread in background:
            thread.join(timeout=60)
    drained = time.monotonic() - t0
    time.sleep(1)  # a worker just resumed from SIGSTOP may still send what it was about to send
    wait_for(lambda: not any(orjson.loads(request(stack.sim_port, "GET", "/queue")[2]).values()),
             "an empty provider queue", timeout=30)  # every execution is in the charge ledger
    charges = orjson.loads(request(stack.sim_port, "GET", "/sim/charges")[2])["charges"]
    broker = redis.Redis(port=stack.redis_port, db=1, decode_responses=True)
    restarts = [e["at_ms"] for e in chaos.log if e["action"].startswith("provider restart")]
    rep = checks.report(stack.client, broker, tenants, charges, load, sampler, stack.work / "blobs",
                        opts.stall_margin, restarts)
    return rep | {"timing": {"admission_s": round(admitted, 1), "until_at_rest_s": round(drained, 1),
                             "all_at_rest": rested},
                  "config": vars(opts) | {"code": code_version()},
                  "faults": dict(faults.injected), "fault_log": faults.log, "chaos": chaos.log,
                  "unexpected_exits": chaos.exits,
                  "workdir": str(stack.work)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--workers", type=int, default=3, help="Dramatiq worker processes")
    p.add_argument("--threads", type=int, default=4, help="threads per worker process")
    p.add_argument("--cap", type=int, default=8, help="RECKON_PROVIDER_CAP: prompts in flight at the provider")
    p.add_argument("--clients", type=int, default=4, help="client threads")
    p.add_argument("--fault-rate", type=float, default=0.2, help="share of provider prompts given a fault")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--delay", type=float, default=0.02, help="seconds the provider takes per prompt")
    p.add_argument("--lease", type=float, default=2.0, help="RECKON_LEASE_SECONDS")
    p.add_argument("--duplicate-cost-allowance", type=int, default=0)
    p.add_argument("--chaos-seconds", type=float, default=120, help="faults and crashes stop after this")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for every job to come to rest")
    p.add_argument("--request-timeout", type=float, default=120, help="a client gives up a request after this")
    p.add_argument("--stall-margin", type=float, default=40, help="seconds a job may wait queued beyond later "
                   "jobs (redelivery windows reach 32 x RECKON_OUTBOX_GRACE_SECONDS), 3x for running/reconciling")
    p.add_argument("--no-chaos", action="store_true", help="provider faults only: no process is killed")
    p.add_argument("--short", action="store_true", help="150 jobs, less chaos (the test suite's run)")
    p.add_argument("--workdir", help="redis dir, blobs and logs (default: a temp dir, removed if every check passes)")
    p.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for every process")
    p.add_argument("--json", help="write the report here")
    opts = p.parse_args()
    if opts.short:
        opts.jobs, opts.tenants, opts.workers, opts.threads = min(opts.jobs, 150), 2, 2, 4
        opts.chaos_seconds, opts.timeout = min(opts.chaos_seconds, 30), min(opts.timeout, 60)
    opts.api_kills, opts.redis_restarts = (1, 1) if opts.short else (2, 2)
    opts.provider_restarts, opts.stalls = (0, 1) if opts.short else (1, 8)
    opts.kill_every, opts.outage, opts.dup_rate, opts.cancel_rate = (6 if opts.short else 4), 1.0, 0.05, 0.05
    return opts


def main() -> int:
    opts = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM, like Ctrl-C, stops the stack first
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    rng = random.Random(opts.seed)
    extra = dict(item.split("=", 1) for item in opts.env)
    use_shards(int(extra.get("RECKON_SHARDS", "1")))  # this process reads the state as the stack writes it
    stack = Stack(Path(opts.workdir or tempfile.mkdtemp(prefix="reckon-soak-")), opts)
    try:
        stack.up()
        rep = soak(stack, opts, rng)
    finally:
        stack.stop()
    if opts.json:
        Path(opts.json).write_bytes(orjson.dumps(rep, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    print(checks.summary(rep), flush=True)
    if rep["ok"] and not opts.workdir:
        shutil.rmtree(stack.work, ignore_errors=True)  # kept on failure: AOF, blobs and every process's log
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
