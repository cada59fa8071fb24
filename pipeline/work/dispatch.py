"""The jobs called to a freed slot, run in the watcher's own process (docs/fleet.md "The slot is the GPU").

The watcher gives a server's slot back when it hears the prompt end there, and the parked jobs called
to it are claimed, staged and sent from here, on a small pool of threads, not published to a worker
through the broker: the broker's hop, and a wait behind the workers' messages, are GPU time thrown
away. The collects run here too, on threads of their own (pipeline/work/collecting.py); every other
message (a reconcile) still goes to the workers, as does a call this process cannot take (shutting down).

What runs here is ``Executor.run``, exactly as a worker runs it, and its failure is routed as the
workers' middleware routes it (``Router.route``); a step that gave a slot back calls the next parked jobs
here too. This process dying mid-run is a worker dying: a job claimed here has a lease, which expires and
is reconciled; a job called and not claimed keeps its call, which lapses, and the sweeper sends it again.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from pipeline.errors import AttemptFailed, StaleLease
from pipeline.state.scripts import ReplicationTimeout
from pipeline.work.executor import Executor
from pipeline.work.routing import Router, called_after

log = logging.getLogger(__name__)

#: The route of a job called to a freed slot (pipeline/work/broker.py ``ROUTES``).
CALLED = "unparked"


class LocalRoute:
    """A ``publish(job_id, route)`` that runs one route's messages here (``threads`` at a time) with ``work``
    (an ``Executor`` method), and hands every other message to ``publish``; ``what`` names them in the log."""

    route = ""
    what = ""

    def __init__(self, executor: Callable[[], Executor], router: Callable[[], Router],
                 publish: Callable[[str, str], None], threads: int) -> None:
        self.executor, self.router, self.publish = executor, router, publish
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=type(self).__name__)

    def __call__(self, job_id: str, route: str) -> None:
        if route != self.route:
            return self.publish(job_id, route)
        try:
            self.pool.submit(self.run, job_id)
        except RuntimeError:  # shutting down: a worker takes it
            self.publish(job_id, route)

    def work(self, executor: Executor, job_id: str) -> None:
        raise NotImplementedError

    def run(self, job_id: str) -> None:
        """One message's work, its failure routed as the workers' middleware routes it; then the jobs called
        to a slot it gave back (sent to the called jobs' route: here, or on to ``publish``)."""
        try:
            executor = self.executor()
            try:
                self.work(executor, job_id)
            except AttemptFailed as failed:
                action = self.router().route(failed)
                log.info("%s %s: %s -> %s", self.what, job_id, failed.cause.error_class, action)
            except (StaleLease, ReplicationTimeout) as exc:  # as the workers' routing: dropped, reconciled
                log.info("%s %s: %s; dropped", self.what, job_id, type(exc).__name__)
            for called in called_after(executor, job_id):
                self(called, CALLED)
        except Exception:  # its lease expires and it is reconciled; an unclaimed call lapses and is sent again
            log.exception("%s %s failed here", self.what, job_id)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class LocalDispatch(LocalRoute):
    """The called jobs' attempts, run here; every other message to ``publish``, the broker's."""

    route, what = CALLED, "called job"

    def work(self, executor: Executor, job_id: str) -> None:
        executor.run(job_id)
