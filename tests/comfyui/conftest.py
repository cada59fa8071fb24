"""A real ComfyUI (v0.3.64, CPU, weights-free graphs) for the tests in this folder.

The fixture ``comfyui`` starts one with ``../shared/comfyui/start.sh`` on a free
loopback port for the tests of this folder (package scope: it is gone before the
timing-sensitive fault tests run) and kills it by its PID at the end. The set-up is read from
``RECKON_COMFYUI_DIR`` (default ``/tmp/comfyui``, installed by
``../shared/comfyui/setup.sh DIR``; ``.ci/run`` does it); without it the tests
skip with the reason shown in pytest's summary.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from tests.conftest import free_port
from tests.pipeline.conftest import admit, broker  # noqa: F401 - fixtures the end-to-end tests share

DEFAULT_DIR = "/tmp/comfyui"
#: The shared folder sits beside the project: <parent>/shared/comfyui/{setup,start}.sh.
SHARED = Path(__file__).resolve().parents[3] / "shared" / "comfyui"
#: Seconds start.sh may take (ComfyUI answers after about 6 s here; start.sh gives up after 120).
START_TIMEOUT = 150
#: Seconds a SIGTERM'd ComfyUI gets before SIGKILL.
STOP_TIMEOUT = 10


@dataclass
class RealComfyUI:
    """A running ComfyUI: where it listens and writes, and how to drive or restart it."""

    directory: Path
    port: int
    output_dir: Path
    pid: int = 0
    _colors: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def adapter(self, **options: Any) -> ComfyUI:
        return ComfyUI(HttpTransport(self.url, timeout=10), price_per_output=options.pop("price_per_output", 10),
                       **options)

    def color(self) -> int:
        """A colour no earlier graph of this process used: ComfyUI caches identical graphs."""
        return next(self._colors) % 0xFFFFFF

    def files(self, prefix: str) -> list[Path]:
        """The files ComfyUI wrote whose name starts with ``prefix``, by name."""
        return sorted(self.output_dir.glob(f"{prefix}*"))

    def get(self, path: str) -> Any:
        """One JSON read, straight from the server (not through the adapter under test)."""
        return orjson.loads(self.adapter().transport.request("GET", path).body)

    def start(self) -> None:
        script = SHARED / "start.sh"
        done = subprocess.run([str(script), str(self.directory), str(self.port), str(self.output_dir)],
                              capture_output=True, text=True, timeout=START_TIMEOUT,
                              env=os.environ | {"PYTHONUNBUFFERED": "1"})  # its log, line by line
        if done.returncode != 0:
            raise RuntimeError(f"ComfyUI did not start: {done.stderr.strip()}")
        self.pid = int(done.stdout.strip())

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; only the PID this fixture started."""
        if not self.pid:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                break
            if _exited(self.pid, STOP_TIMEOUT):
                break
        self.pid = 0

    def executions(self) -> int:
        """Prompts this server's log says it executed ("Prompt executed in ..."), since it started."""
        log = self.output_dir / "comfyui.log"
        return log.read_text(errors="replace").count("Prompt executed in") if log.exists() else 0

    def restart(self) -> None:
        """A new ComfyUI process on the same port and output folder: queue and history are lost."""
        self.stop()
        self.start()


def _exited(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return True
        if state in ("Z", "X"):  # gone, waiting for its parent (init) to reap it
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="package")
def comfyui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealComfyUI]:
    directory = Path(os.environ.get("RECKON_COMFYUI_DIR", DEFAULT_DIR))
    if not (directory / "venv" / "bin" / "python").exists():
        pytest.skip(f"no ComfyUI set-up in {directory} (RECKON_COMFYUI_DIR): run {SHARED}/setup.sh {directory}")
    if not (SHARED / "start.sh").exists():
        pytest.skip(f"no {SHARED}/start.sh to start ComfyUI with")
    server = RealComfyUI(directory, free_port(), tmp_path_factory.mktemp("comfyui-out"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
