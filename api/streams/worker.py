"""The gunicorn worker class of the streams process: uvicorn's, ending open streams when it stops.

An event stream never ends on its own while its job runs, so a worker that waited for every connection
to close would wait until gunicorn's ``graceful_timeout`` killed it. This one cancels them after
``GRACE_SECONDS``; each client comes back to another worker with its ``Last-Event-ID``.
"""

from __future__ import annotations

from typing import Any

from uvicorn_worker import UvicornWorker

#: How long a stopping worker lets open streams run before it cancels them (s).
GRACE_SECONDS = 2


class StreamsWorker(UvicornWorker):
    #: No access log: a stream's line would come when it ends, and a thousand open at once say little.
    CONFIG_KWARGS: dict[str, Any] = {"loop": "asyncio", "http": "h11", "lifespan": "on", "access_log": False,
                                     "timeout_graceful_shutdown": GRACE_SECONDS}
