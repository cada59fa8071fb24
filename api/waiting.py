"""``Prefer: wait`` on the web process: a request held until its job ends, a bounded number at once.

A held request holds one of gunicorn's threads, so it takes one of the slots of the process's event
streams (``RECKON_SSE_MAX_STREAMS``, ``api.sse.StreamSlots``): waiters and streams together never take
every thread. Past that the request is answered at once, without ``Preference-Applied`` (RFC 7240 lets a
server ignore a preference). A held request reads the job's state every ``DEFAULT_POLL_SECONDS`` (one
HGET). The streams process (api/streams/waits.py) holds thousands, woken by the shards' streams of
changes instead. See docs/api.md "Waiting for the result".
"""

from __future__ import annotations

import time
from typing import Any, Callable

import falcon
import orjson

from api.prefer import applied, wait_seconds
from api.sse import StreamSlots
from pipeline.state.keys import JobKeys
from pipeline.state.progress import TERMINAL
from pipeline.state.store import Store

#: How often a held request reads its job's state (s): one HGET each time.
DEFAULT_POLL_SECONDS = 0.25


class Waiter:
    """Holds requests of this process until their job ends, at most as many at once as ``slots`` allow."""

    def __init__(self, store: Store, slots: StreamSlots, *, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store, self.slots, self.poll_seconds = store, slots, poll_seconds
        self.clock, self.sleep = clock, sleep

    def hold(self, req: falcon.Request, resp: falcon.Response, job_id: str, state: str | None) -> bool:
        """Hold the request as its ``Prefer`` asks, until the job is terminal (or gone) or the wait is
        over; ``Preference-Applied`` set when it was honoured. Whether it asked for a wait that was honoured.
        ``state``: the job's state when the caller read it (None: not read), which takes no slot when terminal."""
        seconds = wait_seconds(req.get_header("Prefer"))
        if seconds is None:
            return False
        if state not in TERMINAL and seconds > 0:
            release = self.slots.take()
            if release is None:  # every slot taken: answered at once, the preference ignored
                return False
            try:
                self._until_ended(job_id, self.clock() + seconds)
            finally:
                release()
        resp.set_header("Preference-Applied", applied(seconds))
        return True

    def _until_ended(self, job_id: str, until: float) -> None:
        record = JobKeys(job_id).record
        while True:
            state = self.store.redis.hget(record, "state")
            left = until - self.clock()
            if state is None or state in TERMINAL or left <= 0:
                return
            self.sleep(min(self.poll_seconds, left))


def answer_after_wait(resp: Any, view: dict[str, Any], usual: int | str) -> None:
    """A held request's answer: the job's view now, ``200`` when it ended, else the ``usual`` status."""
    resp.status = falcon.HTTP_200 if view["state"] in TERMINAL else usual
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps(view)  # in place of the admission's answer, if it was one
