"""The bound on one attempt's execution: a prompt that has run its job's ``max_seconds`` is interrupted at
its server (docs/costs.md "Per-second prices"). Used by a worker's own wait and by the watcher."""

from __future__ import annotations

import time
from typing import Callable

#: The job's error reason when reckon interrupted its prompt at ``max_seconds``.
MAX_SECONDS_EXCEEDED = "max_seconds_exceeded"


class RunLimit:
    """Says, once, when a prompt first seen running at least ``max_seconds`` ago (by ``clock``,
    monotonic seconds) is due to be interrupted; 0: never. The server starts a prompt before reckon
    sees it running, so by the server's own timestamps it has run at least as long when stopped."""

    def __init__(self, max_seconds: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_seconds, self.clock = max_seconds, clock
        self.since: float | None = None
        self.done = False

    def due(self, state: str) -> bool:
        if not self.max_seconds or self.done or state != "running":
            return False
        now = self.clock()
        if self.since is None:
            self.since = now
        self.done = now - self.since >= self.max_seconds
        return self.done
