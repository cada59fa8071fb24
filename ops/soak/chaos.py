"""What the soak throws at the stack: provider faults (``Faults``) and process crashes, restarts and
network cuts (``Chaos``), each on its own thread at a seeded random pace."""

from __future__ import annotations

import argparse
import http.client
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import redis

from ops.soak.stack import PROVIDER, Stack, request
from pipeline.state.store import Store

FAULT_KINDS = ["latency", "error_before", "error_after", "rate_limit", "policy", "auth", "drop", "partial",
               "read_error"]
REFUSALS = {"error_before", "rate_limit", "policy", "auth"}  # nothing is queued: no charge to count them by
READ_PATHS = ["/history", "/queue", "/view", "/system_stats"]


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
