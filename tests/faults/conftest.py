"""A real stack for crash and end-to-end tests: simulated provider, gunicorn, Dramatiq, watcher, sweeper.

Every process a test starts is stopped (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import orjson
import pytest

from tests.conftest import REDIS_URL, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Stack:
    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.web_port, self.sim_port = free_port(), free_port()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.env = os.environ | {
            "RECKON_REDIS_URL": REDIS_URL,
            "RECKON_BROKER_URL": REDIS_URL[:-1] + "1",
            "RECKON_PROVIDER_URL": f"http://127.0.0.1:{self.sim_port}",
            "RECKON_BLOB_DIR": str(tmp_path / "blobs"),
            "RECKON_SWEEP_INTERVAL_SECONDS": "0.2",
            "RECKON_POLL_INTERVAL_SECONDS": "0.02",
            "RECKON_LEASE_SECONDS": "2",
            "RECKON_RECONCILE_INTERVAL_SECONDS": "0.3",
            "RECKON_OUTBOX_GRACE_SECONDS": "1",
            "RECKON_SUBMIT_SETTLE_SECONDS": "1",
            "RECKON_WATCH_POLL_SECONDS": "0.2",
            "PORT": str(self.web_port),
            **env,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str, pause_at: str | None = None) -> None:
        """Start a process; with ``pause_at`` it stops at that fault point (see pipeline.faultpoints)."""
        env = dict(self.env)
        if pause_at:
            env |= {"RECKON_PAUSE_AT": pause_at, "RECKON_PAUSE_FILE": str(self.pause_file(name))}
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def pause_file(self, name: str) -> Path:
        return self.logs / f"{name}.paused"

    def kill_when_paused(self, name: str, timeout: float = 20.0) -> None:
        """Wait until the process reached its fault point, then SIGKILL it."""
        wait_until(self.pause_file(name).exists, timeout=timeout)
        self.kill(name)

    def start_provider(self, delay: float = 0.0) -> None:
        self.start("provider", str(BIN / "python"), "-m", "pipeline.providers.sim",
                   "--port", str(self.sim_port), "--delay", str(delay))
        wait_until(lambda: self._up(f"http://127.0.0.1:{self.sim_port}/queue"))

    def start_web(self, pause_at: str | None = None) -> None:
        self.start("web", str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()",
                   pause_at=pause_at)
        wait_until(lambda: self._up(f"http://127.0.0.1:{self.web_port}/readyz"), timeout=20)

    def start_worker(self, pause_at: str | None = None, *, watcher: bool = True, watcher_at: str | None = None) -> None:
        """A Dramatiq worker, and (unless one runs already) the watcher that follows its prompts (stopping at
        ``watcher_at``)."""
        self.start("worker", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors", "--processes", "1",
                   "--threads", "2", pause_at=pause_at)
        if watcher and "watcher" not in self.procs:
            self.start_watcher(watcher_at)

    def start_watcher(self, pause_at: str | None = None) -> None:
        """The watcher (it collects the prompts it hears end, and runs the jobs called to the slots they free)."""
        self.start("watcher", str(BIN / "python"), "-m", "pipeline.work.watcher", pause_at=pause_at)

    def start_sweeper(self) -> None:
        self.start("sweeper", str(BIN / "python"), "-m", "pipeline.work.sweeper")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=20)

    def stop(self, graceful: bool = True) -> None:
        """SIGTERM every process group (SIGKILL one that ever stopped at a fault point: waiting there, it
        sleeps through SIGTERM), then SIGKILL what is left after 10 s: the whole group, since a group
        leader (Dramatiq's main process) can exit while its children still consume messages that the
        next test publishes. ``graceful=False`` SIGKILLs every group at once: for a test that reads
        nothing the processes write on their way out (their logs' last lines), it saves the 1.5 to 3 s
        that Dramatiq and gunicorn take to stop."""
        for name, proc in self.procs.items():  # one waiting at its fault point would only sleep through SIGTERM
            quick = not graceful or self.pause_file(name).exists()
            _signal_group(proc.pid, signal.SIGKILL if quick else signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    @staticmethod
    def _up(url: str) -> bool:
        try:
            with urlopen(url, timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10,
            **headers: str) -> tuple[int, dict[str, str], bytes]:
        data = orjson.dumps(body) if body is not None else None
        req = Request(f"http://127.0.0.1:{self.web_port}{path}", data=data, method=method,
                      headers={"Content-Type": "application/json", **headers})
        try:
            with urlopen(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()

    def sim_post(self, path: str, body: Any) -> None:
        """A control request to the simulated provider (faults, restart)."""
        req = Request(f"http://127.0.0.1:{self.sim_port}{path}", data=orjson.dumps(body), method="POST")
        with urlopen(req, timeout=5) as resp:
            resp.read()

    def sim_running(self) -> bool:
        """Whether the simulated provider is running a prompt now."""
        with urlopen(f"http://127.0.0.1:{self.sim_port}/queue", timeout=5) as resp:
            return bool(orjson.loads(resp.read())["queue_running"])

    def sim_faults(self) -> list[dict[str, Any]]:
        with urlopen(f"http://127.0.0.1:{self.sim_port}/sim/faults", timeout=5) as resp:
            return orjson.loads(resp.read())["faults"]

    def charges(self) -> dict[str, Any]:
        with urlopen(f"http://127.0.0.1:{self.sim_port}/sim/charges", timeout=5) as resp:
            return orjson.loads(resp.read())


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies, waiting for their parent, are not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@pytest.fixture
def stack(redis_client, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(tmp_path)
    try:
        yield running
    finally:
        running.stop(graceful=False)  # the test is over: a test that reads the logs stops the stack itself
