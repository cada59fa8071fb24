"""The baseline of ``ops/bench/bench.py``: a bare Dramatiq no-op actor on the Redis broker (its default
middleware, as ``dramatiq`` runs it), taking a job id as reckon's actors do.

With ``BENCH_RECEIPTS`` set (the pickup phase only), the actor pushes ``time.time()`` on receipt onto
that Redis list of the broker's database, so the bench can time each message from send to run."""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

#: The baseline's queue (and the broker namespace ``bare``), apart from reckon's.
QUEUE = "bare"
#: The list each receipt time goes to, or None: no receipts (the drain phase).
RECEIPTS = os.environ.get("BENCH_RECEIPTS") or None

broker = RedisBroker(url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/1"), namespace="bare")
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop(job_id: str) -> None:
    """Does nothing (but note its receipt time when asked)."""
    if RECEIPTS:
        broker.client.rpush(RECEIPTS, repr(time.time()))
