"""The collects of the prompts the watcher heard end, run in the watcher's own process (docs/fleet.md
"The slot is the GPU").

The watcher hears a prompt end and its job's outputs are fetched, cleaned, stored and the job finished
here, on a small pool of threads of its own, not published to a worker through the broker: the broker's
hop (the publish, the doorbell, a worker's fetch) was a fifth of an idle job's time beyond its prompt
(docs/performance.md "GPU busy time"). The pool is not the called jobs' (pipeline/work/dispatch.py), so a
collect never makes a called job wait for a thread: the GPU's next prompt goes first.

What runs here is ``Executor.collect``, exactly as a worker runs it: idempotent (a job no longer waiting
at a server is not claimed again) and fenced (its claim has a lease). Its failure is routed as the
workers' middleware routes it (``Router.route``). This process dying mid-collect is a worker dying: the
claim's lease expires and the job is reconciled from the server's own record, its outputs stored and
its run booked once. A collect this process cannot take (shutting down) goes to the workers.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from pipeline import faultpoints
from pipeline.errors import AttemptFailed, StaleLease
from pipeline.state.scripts import ReplicationTimeout
from pipeline.work.executor import Executor
from pipeline.work.dispatch import CALLED
from pipeline.work.routing import Router, called_after

log = logging.getLogger(__name__)

#: The route of a prompt heard ending (pipeline/work/broker.py ``ROUTES``).
COLLECT = "collect"
#: Threads that collect in the watcher's process, at most (one per server below that).
COLLECT_THREADS = 4


class LocalCollect:
    """A ``publish(job_id, route)`` that runs collects here (``threads`` at a time) and hands every other
    message to ``publish`` (the called jobs' dispatch, then the broker)."""

    def __init__(self, executor: Callable[[], Executor], router: Callable[[], Router],
                 publish: Callable[[str, str], None], threads: int) -> None:
        self.executor, self.router, self.publish = executor, router, publish
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="collect")

    def __call__(self, job_id: str, route: str) -> None:
        if route != COLLECT:
            return self.publish(job_id, route)
        try:
            self.pool.submit(self.run, job_id)
        except RuntimeError:  # shutting down: a worker takes it
            self.publish(job_id, route)

    def run(self, job_id: str) -> None:
        """One collect, its failure routed (as the workers' ``FailureRouter``); then the jobs called to a slot
        it gave back (a prompt whose end was not heard keeps its slot to the finish: as the workers' ``Unpark``)."""
        faultpoints.reached("before_collect")  # crash tests: a collect heard and not begun
        try:
            executor = self.executor()
            try:
                executor.collect(job_id)
            except AttemptFailed as failed:
                action = self.router().route(failed)
                log.info("collect of %s: %s -> %s", job_id, failed.cause.error_class, action)
            except (StaleLease, ReplicationTimeout) as exc:  # as the workers' routing: dropped, reconciled
                log.info("collect of %s: %s; dropped", job_id, type(exc).__name__)
            for called in called_after(executor, job_id):
                self.publish(called, CALLED)
        except Exception:  # its lease expires and it is reconciled; an unclaimed collect is asked again
            log.exception("collect of %s failed here", job_id)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
