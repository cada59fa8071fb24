"""Each server's prompt run times, as its watcher hears them: from ``execution_start`` to the end of the prompt.

The watcher of a server (pipeline/work/watcher.py) tells its ``RunClock`` when a prompt starts (with its job's
``ckpt``, the checkpoint digest lua/await.lua copies into the watch entry) and ends; the clock keeps the newest
``KEEP`` run times of the server and, per checkpoint, the newest ``KEEP`` warm runs (the prompt before it on
the server had the same checkpoint) and ``KEEP`` loads (it had another one: the model was loaded). A run whose
previous checkpoint is unknown (the first heard, or either without a ``ckpt``) counts for the server only. It
writes them, when new ones came, at most every ``FLUSH_SECONDS`` to ``keys.RUN_TIMES`` (one HSET: field
``<server>`` its run times, ``<server>|ckpt`` its checkpoints' as JSON; a cost per server and time, none per
job). The planner (pipeline/work/planner.py) makes its ETA ranges from their quantiles. A prompt whose start this
watcher did not hear (it took over, or reconnected) gives no run time; nor does an end heard twice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import orjson

from pipeline.state import keys

#: Run times kept per server (the newest), and per checkpoint of a server, warm and loads each.
KEEP = 50
#: Checkpoints kept per server (the most recently run).
KEEP_CKPTS = 20
#: How often new run times are written, at most (s).
FLUSH_SECONDS = 5.0
#: The suffix of a server's per-checkpoint field in ``keys.RUN_TIMES``.
CKPTS = "|ckpt"


class RunClock:
    """``clock``: monotonic seconds (run times are durations: no clock of another host is compared)."""

    def __init__(self, server: str, client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.server, self.client, self.clock = server, client, clock
        self.begun: dict[str, tuple[float, str | None, str | None]] = {}  # job -> (start, ckpt, warm/load)
        self.runs: deque[int] = deque(maxlen=KEEP)
        self.ckpts: dict[str, dict[str, deque[int]]] = {}  # ckpt -> {"warm": run times, "load": run times}
        self.last: str | None = None  # the checkpoint of the last prompt started here (None: unknown)
        self.fresh = False
        self.next_flush = 0.0

    def started(self, job_id: str, ckpt: str | None = None) -> None:
        """A server runs one prompt at a time, in the order they start: the one before this one had ``last``."""
        kind = None if not (ckpt and self.last) else "warm" if ckpt == self.last else "load"
        self.begun[job_id] = (self.clock(), ckpt, kind)
        self.last = ckpt

    def ended(self, job_id: str) -> None:
        begun = self.begun.pop(job_id, None)
        if begun is None:
            return
        (began, ckpt, kind), self.fresh = begun, True
        ms = int((self.clock() - began) * 1000)
        self.runs.append(ms)
        if ckpt and kind:
            kept = self.ckpts.pop(ckpt, None) or {"warm": deque(maxlen=KEEP), "load": deque(maxlen=KEEP)}
            kept[kind].append(ms)
            self.ckpts[ckpt] = kept  # the most recently run last
            while len(self.ckpts) > KEEP_CKPTS:
                del self.ckpts[next(iter(self.ckpts))]

    def flush(self, watched: Any) -> None:
        """Write the run times if new ones came and ``FLUSH_SECONDS`` passed; drop the starts of prompts no
        longer ``watched`` (collected elsewhere, reconciled)."""
        for job_id in [j for j in self.begun if j not in watched]:
            del self.begun[job_id]
        now = self.clock()
        if self.fresh and now >= self.next_flush:
            by_ckpt = {ckpt: {kind: list(ms) for kind, ms in kept.items()} for ckpt, kept in self.ckpts.items()}
            self.client.hset(keys.RUN_TIMES, mapping={self.server: ",".join(map(str, self.runs)),
                                                      self.server + CKPTS: orjson.dumps(by_ckpt).decode()})
            self.fresh, self.next_flush = False, now + FLUSH_SECONDS


def parse(raw: dict[str, str]) -> dict[str, list[int]]:
    """``keys.RUN_TIMES`` as read (HGETALL): server -> its kept run times (ms), oldest first."""
    return {server: [int(ms) for ms in value.split(",") if ms] for server, value in raw.items()
            if not server.endswith(CKPTS)}


def parse_ckpts(raw: dict[str, str]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """``keys.RUN_TIMES`` as read: server -> checkpoint -> {"warm": run times, "load": run times} (ms)."""
    return {server[:-len(CKPTS)]: orjson.loads(value) for server, value in raw.items() if server.endswith(CKPTS)}
