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
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

import soak_check as checks  # noqa: E402

from ops.bench.benchlib import free_port  # noqa: E402
from pipeline.state.keys import JobKeys, TenantKeys, use_shards
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant

PROVIDER = "comfyui"
FAULT_KINDS = ["latency", "error_before", "error_after", "rate_limit", "policy", "auth", "drop", "partial",
               "read_error"]
REFUSALS = {"error_before", "rate_limit", "policy", "auth"}  # nothing is queued: no charge to count them by
READ_PATHS = ["/history", "/queue", "/view", "/system_stats"]


def request(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body, headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def wait_for(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException, redis.RedisError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"soak: {what} did not come up")


class Stack:
    """The processes, each in its own process group; a name maps to one running process."""

    def __init__(self, work: Path, opts: argparse.Namespace) -> None:
        self.work, self.opts, self.logs = work, opts, work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.redis_port, self.web_port, self.sim_port = free_port(), free_port(), free_port()
        url = f"redis://127.0.0.1:{self.redis_port}"
        self.env = os.environ | {
            "RECKON_REDIS_URL": f"{url}/0", "RECKON_BROKER_URL": f"{url}/1", "PORT": str(self.web_port),
            "RECKON_PROVIDER_URL": f"http://127.0.0.1:{self.sim_port}", "RECKON_BLOB_DIR": str(work / "blobs"),
            "RECKON_LEASE_SECONDS": str(opts.lease), "RECKON_SWEEP_INTERVAL_SECONDS": "0.2",
            "RECKON_POLL_INTERVAL_SECONDS": "0.02", "RECKON_RECONCILE_INTERVAL_SECONDS": "0.3",
            "RECKON_OUTBOX_GRACE_SECONDS": "1", "RECKON_RETRY_BASE_SECONDS": "0.2",
            "RECKON_PROVIDER_CAP": str(opts.cap), "RECKON_WATCH_POLL_SECONDS": "0.2",
            # half a lease plus the 10 s connect timeout, and a margin (docs/failures.md, "Reconciliation")
            "RECKON_SUBMIT_SETTLE_SECONDS": str(opts.lease / 2 + 11),
            "RECKON_DUPLICATE_COST_ALLOWANCE": str(opts.duplicate_cost_allowance),
        } | dict(item.split("=", 1) for item in opts.env)
        self.procs: dict[str, tuple[subprocess.Popen[bytes], tuple[str, ...]]] = {}
        self.seq = 0
        self.client = redis.Redis(port=self.redis_port, decode_responses=True, socket_timeout=10)

    def start(self, name: str, *argv: str) -> None:
        with open(self.logs / f"{name.split('-')[0]}.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs[name] = (proc, argv)

    def pids(self, name: str) -> list[int]:
        """Every process in ``name``'s group (Dramatiq's worker child too: attempts name it by pid)."""
        group, found = self.procs[name][0].pid, []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found += [int(stat.parent.name)] if int(fields[2]) == group else []
        return sorted(found)

    def signal(self, name: str, sig: int) -> None:
        os.killpg(self.procs[name][0].pid, sig)

    def kill(self, name: str) -> None:
        proc, _ = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)

    def start_redis(self) -> None:
        self.start("redis", "redis-server", "ops/redis.conf", "--port", str(self.redis_port), "--dir", str(self.work))
        wait_for(self.client.ping, "redis-server")

    def start_web(self) -> None:
        self.start("web", str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()")
        wait_for(lambda: request(self.web_port, "GET", "/readyz", timeout=2)[0] == 200, "gunicorn")

    def start_worker(self) -> str:
        self.seq += 1
        self.start(f"worker-{self.seq}", str(BIN / "dramatiq"), "pipeline.work.actors", "--processes", "1",
                   "--threads", str(self.opts.threads))
        return f"worker-{self.seq}"

    def up(self) -> None:
        self.start_redis()
        self.start("provider", str(BIN / "python"), "-m", "pipeline.providers.sim", "--port", str(self.sim_port),
                   "--delay", str(self.opts.delay))
        wait_for(lambda: request(self.sim_port, "GET", "/sim/faults")[0] == 200, "simulated provider")
        self.start_web()
        self.start("sweeper", str(BIN / "python"), "-m", "pipeline.work.sweeper")
        self.start_watcher()
        for _ in range(self.opts.workers):
            self.start_worker()

    def start_watcher(self) -> None:
        self.start("watcher", str(BIN / "python"), "-m", "pipeline.work.watcher")

    def workers(self) -> list[str]:
        return sorted(name for name in self.procs if name.startswith("worker-"))

    def revive(self) -> list[dict[str, Any]]:
        """Restart any process that exited on its own (a supervisor would); returns what exited."""
        exited = [(name, proc.returncode, argv) for name, (proc, argv) in self.procs.items()
                  if proc.poll() is not None]
        for name, _, argv in exited:
            self.start(name, *argv)
        return [{"at": time.time(), "process": name, "returncode": rc} for name, rc, _ in exited]

    def stop(self) -> None:
        """SIGTERM to every group (Redis last, so the others stop quietly), SIGKILL after 15 s."""
        for names in ([n for n in self.procs if n != "redis"], [n for n in self.procs if n == "redis"]):
            for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a SIGSTOPped worker must see its SIGTERM
                for name in names:
                    self.killpg(self.procs[name][0], sig)
            for name in names:
                try:
                    self.procs[name][0].wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.killpg(self.procs[name][0], signal.SIGKILL)
                    self.procs[name][0].wait()
        self.procs.clear()

    @staticmethod
    def killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the group: gunicorn's and Dramatiq's children too
        except ProcessLookupError:
            pass


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


def make_fault(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind == "latency":
        return {"kind": kind, "seconds": round(rng.uniform(0.2, 2.5), 2), "times": rng.randint(1, 3)}
    if kind == "rate_limit":
        return {"kind": kind, "retry_after": 1, "times": 1}
    if kind == "partial":
        return {"kind": kind, "produce": rng.randint(0, 1), "times": 1}
    if kind == "read_error":
        return {"kind": kind, "path": rng.choice(READ_PATHS), "status": rng.choice([500, 502, 0]), "times": 1}
    return {"kind": kind, "times": 1}


class Faults(threading.Thread):
    """Keeps about ``rate`` of the provider's prompts faulty, one fault at a time, every kind in turn."""

    def __init__(self, stack: Stack, rate: float, rng: random.Random, until: float) -> None:
        super().__init__(name="faults", daemon=True)
        self.stack, self.rate, self.rng, self.until = stack, rate, rng, until
        self.stop = threading.Event()
        self.injected: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.kinds: list[str] = []
        self.refusals, self.posted_at, self.auth_pending = 0, 0.0, False
        self.clear_at: float | None = None
        self.executions, self.counted_at = 0, 0.0

    def sim(self, method: str, path: str, body: Any = None) -> Any:
        return orjson.loads(request(self.stack.sim_port, method, path, orjson.dumps(body) if body else None)[2])

    def run(self) -> None:
        while not self.stop.wait(0.1) and time.monotonic() < self.until:
            try:
                self.step()
            except (OSError, http.client.HTTPException, redis.RedisError):
                pass
        try:
            self.sim("POST", "/sim/faults", {"faults": []})
            Store(self.stack.client).clear_provider(PROVIDER)
        except (OSError, http.client.HTTPException, redis.RedisError):
            pass

    def step(self) -> None:
        active = [f for f in self.sim("GET", "/sim/faults")["faults"] if f.get("times", 1) > 0]
        if self.auth_pending and not any(f["kind"] == "auth" for f in active):
            self.auth_pending, self.clear_at = False, time.monotonic() + 1.0
        if self.clear_at is not None and time.monotonic() >= self.clear_at:
            Store(self.stack.client).clear_provider(PROVIDER)  # auth blocks dispatch until an operator clears it
            self.clear_at = None
        if active and time.monotonic() - self.posted_at < 5:
            return
        if active:
            self.injected["replaced unconsumed"] += 1
        if time.monotonic() - self.counted_at > 1:  # the charge ledger grows: read it once a second
            self.executions, self.counted_at = len(self.sim("GET", "/sim/charges")["charges"]), time.monotonic()
        prompts = self.executions + self.refusals
        if sum(n for k, n in self.injected.items() if k != "replaced unconsumed") >= self.rate * prompts:
            return
        self.kinds = self.kinds or self.rng.sample(FAULT_KINDS, len(FAULT_KINDS))
        fault = make_fault(self.kinds.pop(), self.rng)
        self.sim("POST", "/sim/faults", {"faults": [fault]})
        self.posted_at = time.monotonic()
        self.log.append({"at_ms": int(time.time() * 1000), **fault})
        self.injected[fault["kind"] + (f" {fault['path']}" if "path" in fault else "")] += 1
        self.refusals += fault["kind"] in REFUSALS
        self.auth_pending = self.auth_pending or fault["kind"] == "auth"


class Chaos(threading.Thread):
    """Crashes keyed to progress (API kills, Redis restarts), periodic worker SIGKILLs and stalls;
    and, until stopped, restarts whatever exited on its own."""

    def __init__(self, stack: Stack, opts: argparse.Namespace, rng: random.Random,
                 progress: Callable[[], dict[str, float]]) -> None:
        super().__init__(name="chaos", daemon=True)
        self.stack, self.opts, self.rng, self.progress = stack, opts, rng, progress
        self.plan = [] if opts.no_chaos else (
            [("admitted", f, self.kill_web) for f in (0.3, 0.65)[:opts.api_kills]]
            + [(p, f, self.restart_redis) for p, f in (("admitted", 0.5), ("drained", 0.3))[:opts.redis_restarts]]
            + [("drained", 0.25, self.restart_provider)][:opts.provider_restarts]
            + [("admitted", 0.4, self.drop_websockets), ("admitted", 0.8, self.kill_watcher)])
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.until = self.t0 + opts.chaos_seconds
        self.next_kill, self.next_stall = self.t0 + opts.kill_every, self.t0 + 3
        self.stalled: tuple[str, float] | None = None
        self.stalls = 0
        self.log: list[dict[str, Any]] = []
        self.exits: list[dict[str, Any]] = []

    def record(self, action: str, **info: Any) -> None:
        self.log.append({"t": round(time.monotonic() - self.t0, 2), "at_ms": int(time.time() * 1000),
                         "action": action, **info})

    def run(self) -> None:
        while not self.stop.wait(0.25):
            try:
                self.tick()
            except (OSError, http.client.HTTPException, redis.RedisError, RuntimeError) as exc:
                self.record("error", error=repr(exc))
        if self.stalled:
            self.stack.signal(self.stalled[0], signal.SIGCONT)

    def tick(self) -> None:
        self.exits += self.stack.revive()
        now = time.monotonic()
        if self.stalled and now >= self.stalled[1]:
            self.stack.signal(self.stalled[0], signal.SIGCONT)
            self.record("SIGCONT", process=self.stalled[0])
            self.stalled = None
        if self.opts.no_chaos or now > self.until:
            return
        progress = self.progress()
        for entry in [e for e in self.plan if progress[e[0]] >= e[1]]:
            self.plan.remove(entry)
            entry[2]()
        if now >= self.next_kill:
            victim = self.rng.choice([w for w in self.stack.workers() if not self.stalled or w != self.stalled[0]])
            pids = self.stack.pids(victim)
            self.stack.kill(victim)
            self.record("SIGKILL", process=victim, pids=pids, replaced_by=self.stack.start_worker())
            self.next_kill = now + self.opts.kill_every
        if self.stalled is None and now >= self.next_stall and self.stalls < self.opts.stalls:
            victim, seconds = self.rng.choice(self.stack.workers()), self.rng.uniform(1.1, 3) * self.opts.lease
            self.stack.signal(victim, signal.SIGSTOP)
            self.stalled, self.stalls, self.next_stall = (victim, now + seconds), self.stalls + 1, now + 8
            self.record("SIGSTOP", process=victim, pids=self.stack.pids(victim), seconds=round(seconds, 2))

    def kill_web(self) -> None:
        self.stack.kill("web")
        self.record("SIGKILL", process="web")
        self.stack.start_web()
        self.record("started", process="web")

    def restart_redis(self) -> None:
        self.stack.kill("redis")
        self.record("SIGKILL", process="redis")
        time.sleep(self.opts.outage)
        self.stack.start_redis()
        self.record("started", process="redis (AOF reloaded)")

    def drop_websockets(self) -> None:
        request(self.stack.sim_port, "POST", "/sim/ws-drop")  # the watcher falls back to /history meanwhile
        self.record("websockets dropped")

    def kill_watcher(self) -> None:
        self.stack.kill("watcher")  # its prompts' leases expire: reconciliation collects them
        self.record("SIGKILL", process="watcher")
        time.sleep(2 * self.opts.lease)
        self.stack.start_watcher()
        self.record("started", process="watcher")

    def restart_provider(self) -> None:
        request(self.stack.sim_port, "POST", "/sim/restart")  # queue and history lost: outcomes become unknowable
        self.record("provider restart (history lost)")


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
        time.sleep(1)
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
    p.add_argument("--short", action="store_true", help="300 jobs, less chaos (the test suite's run)")
    p.add_argument("--workdir", help="redis dir, blobs and logs (default: a temp dir, removed if every check passes)")
    p.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for every process")
    p.add_argument("--json", help="write the report here")
    opts = p.parse_args()
    if opts.short:
        opts.jobs, opts.tenants, opts.workers, opts.threads = min(opts.jobs, 300), 2, 2, 4
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
