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

from pipeline import faultpoints
from pipeline.work.dispatch import LocalRoute
from pipeline.work.executor import Executor

#: The route of a prompt heard ending (pipeline/work/broker.py ``ROUTES``).
COLLECT = "collect"
#: Threads that collect in the watcher's process, at most (one per server below that).
COLLECT_THREADS = 4


class LocalCollect(LocalRoute):
    """The collects, run here; every other message to ``publish`` (the called jobs' dispatch, then the
    broker). A prompt whose end was not heard keeps its slot to the finish, which calls the next jobs."""

    route, what = COLLECT, "collect of"

    def run(self, job_id: str) -> None:
        faultpoints.reached("before_collect")  # crash tests: a collect heard and not begun
        super().run(job_id)

    def work(self, executor: Executor, job_id: str) -> None:
        executor.collect(job_id)
