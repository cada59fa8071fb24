"""Faults are injected per run, for the next N prompts, with ``POST /sim/faults``
(``{"faults": [{"kind": "rate_limit", "times": 2, "retry_after": 3}]}``) or the
``SIM_FAULTS`` variable (the same JSON list). Kinds:

- ``latency`` (``seconds``): every response is delayed, for ``times`` requests
- ``error_before``: 500, nothing queued
- ``error_after``: the prompt is queued (runs, is charged), then 500
- ``rate_limit`` (``retry_after`` seconds): 429 with Retry-After, nothing queued
- ``policy``: 403, refused on policy, nothing queued
- ``auth``: 401, credentials refused, nothing queued
- ``drop``: the prompt is queued (runs, is charged), the connection closes unanswered
- ``upload_error`` (``status``): ``POST /upload/image`` answers ``status`` (default 500), nothing stored
- ``lose_inputs``: the input folder is emptied just before the next prompt is validated
- ``partial`` (``produce``): the prompt produces only its first ``produce`` outputs, then fails
- ``read_error`` (``path``, ``status``): a read (GET) whose path starts with ``path`` (``/history``,
  ``/queue``, ``/view``, ``/system_stats``) answers ``status`` (default 500; 0 closes the connection
  unanswered); nothing changes at the provider
- ``control_error`` (``status``): ``POST /queue`` (a delete) and ``POST /interrupt`` answer ``status``
  (default 500); nothing is deleted or interrupted
- ``trickle`` (``path``, ``seconds``, ``close``): a read whose path starts with ``path`` sends its body
  one byte every ``seconds`` (default 2), each inside any read timeout; with ``close``, its answer
  says ``Connection: close``

Any fault with ``after`` lets that many matching requests pass before it takes effect.
"""

from __future__ import annotations

import threading
from typing import Any


class Faults:
    """The faults of the next requests, used up as they are taken (under the simulator's lock)."""

    def __init__(self, lock: threading.Condition) -> None:
        self.lock = lock
        self._faults: list[dict[str, Any]] = []

    def set(self, faults: list[dict[str, Any]]) -> None:
        with self.lock:
            self._faults = list(faults)

    def listing(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(fault) for fault in self._faults]

    def take(self, *kinds: str, path: str = "") -> dict[str, Any] | None:
        """The first active fault of one of ``kinds`` (matching ``path`` if it names one), counting one use."""
        with self.lock:
            for fault in self._faults:
                if fault["kind"] in kinds and fault.get("times", 1) > 0 and path.startswith(fault.get("path", "")):
                    if fault.get("after", 0) > 0:  # lets this many matching uses pass first
                        fault["after"] -= 1
                        continue
                    fault["times"] = fault.get("times", 1) - 1
                    return dict(fault)
        return None
