"""The soak's own stack: a private redis-server, gunicorn, Dramatiq workers, the watcher, the
sweeper and a simulated ComfyUI, each a real process the chaos thread may kill or restart."""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ops.bench.benchlib import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROVIDER = "comfyui"


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
