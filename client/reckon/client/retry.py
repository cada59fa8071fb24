"""When to try a request again: ``Retry-After`` when the API sends it, else capped exponential
backoff with jitter, always within the call's deadline (reckon's docs/client.md "Retries")."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

#: The first wait of the backoff (s); each later one doubles, up to ``DEFAULT_BACKOFF_CAP``.
DEFAULT_BACKOFF_BASE = 0.25
#: The longest wait of the backoff (s).
DEFAULT_BACKOFF_CAP = 8.0
#: A wait the API asked for (Retry-After) is stretched by up to this fraction, so that clients told
#: the same time do not all come back in the same instant; never shortened.
RETRY_AFTER_SPREAD = 0.1


@dataclass(frozen=True)
class Backoff:
    """The waits between tries of one request. ``random`` returns a float in [0, 1) (injected in tests)."""

    base: float = DEFAULT_BACKOFF_BASE
    cap: float = DEFAULT_BACKOFF_CAP
    random: Callable[[], float] = random.random

    def wait(self, tries: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``tries`` failed tries (1 after the first): ``retry_after`` plus up
        to a tenth more; else half of ``min(cap, base * 2 ** (tries - 1))`` plus up to as much again
        at random ("equal jitter": never zero, never above the cap)."""
        if retry_after is not None:
            return retry_after * (1 + RETRY_AFTER_SPREAD * self.random())
        ceiling = min(self.cap, self.base * 2.0 ** min(tries - 1, 32))
        return ceiling / 2 * (1 + self.random())


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (what reckon sends), None if absent or not a number of seconds
    (an HTTP date would need the wall clock; the backoff applies instead)."""
    if value is None or not value.strip().isascii() or not value.strip().isdigit():
        return None
    return float(int(value.strip()))
