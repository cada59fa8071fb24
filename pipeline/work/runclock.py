"""Each server's prompt run times, as its watcher hears them: from ``execution_start`` to the end of the prompt.

The watcher of a server (pipeline/work/watcher.py) tells its ``RunClock`` when a prompt starts and ends; the
clock keeps the newest ``KEEP`` run times and writes them, when new ones came, at most every
``FLUSH_SECONDS`` to ``keys.RUN_TIMES`` (one HSET: a cost per server and time, none per job). The planner
(pipeline/work/planner.py) makes its ETA ranges from their quantiles. A prompt whose start this watcher did
not hear (it took over, or reconnected) gives no run time; nor does an end heard twice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from pipeline.state import keys

#: Run times kept per server (the newest).
KEEP = 50
#: How often new run times are written, at most (s).
FLUSH_SECONDS = 5.0


class RunClock:
    """``clock``: monotonic seconds (run times are durations: no clock of another host is compared)."""

    def __init__(self, server: str, client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.server, self.client, self.clock = server, client, clock
        self.begun: dict[str, float] = {}
        self.runs: deque[int] = deque(maxlen=KEEP)
        self.fresh = False
        self.next_flush = 0.0

    def started(self, job_id: str) -> None:
        self.begun[job_id] = self.clock()

    def ended(self, job_id: str) -> None:
        began = self.begun.pop(job_id, None)
        if began is not None:
            self.runs.append(int((self.clock() - began) * 1000))
            self.fresh = True

    def flush(self, watched: Any) -> None:
        """Write the run times if new ones came and ``FLUSH_SECONDS`` passed; drop the starts of prompts no
        longer ``watched`` (collected elsewhere, reconciled)."""
        for job_id in [j for j in self.begun if j not in watched]:
            del self.begun[job_id]
        now = self.clock()
        if self.fresh and now >= self.next_flush:
            self.client.hset(keys.RUN_TIMES, self.server, ",".join(map(str, self.runs)))
            self.fresh, self.next_flush = False, now + FLUSH_SECONDS


def parse(raw: dict[str, str]) -> dict[str, list[int]]:
    """``keys.RUN_TIMES`` as read (HGETALL): server -> its kept run times (ms), oldest first."""
    return {server: [int(ms) for ms in value.split(",") if ms] for server, value in raw.items()}
