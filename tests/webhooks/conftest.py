"""A real webhook receiver process (tests/webhooks/receiver.py) on a free loopback port, stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

import orjson
import pytest

from tests.conftest import free_port, wait_until

RECEIVER = Path(__file__).with_name("receiver.py")


class Receiver:
    def __init__(self, tmp_path: Path) -> None:
        self.port, self.log = free_port(), tmp_path / "received.jsonl"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(RECEIVER), str(self.port), str(self.log)])
        wait_until(self._up, timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def plan(self, *answers: str) -> None:
        with urlopen(Request(f"{self.url}/_plan", data=orjson.dumps(list(answers)), method="POST"), timeout=5):
            pass

    def release(self) -> None:
        """Lets every ``hold`` answer go, those waiting and those to come."""
        with urlopen(Request(f"{self.url}/_release", data=b"", method="POST"), timeout=5):
            pass

    def received(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [orjson.loads(line) for line in self.log.read_text().splitlines() if line.endswith("}")]

    def _up(self) -> bool:
        try:
            self.plan()
            return True
        except OSError:
            return False


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    running = Receiver(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()
