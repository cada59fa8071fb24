"""The baseline of ``ops/bench.py``: a bare Dramatiq no-op actor on the Redis broker (its default
middleware, as ``dramatiq`` runs it), taking a job id as reckon's actors do."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

#: The baseline's queue (and the broker namespace ``bare``), apart from reckon's.
QUEUE = "bare"

broker = RedisBroker(url=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/1"), namespace="bare")
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop(job_id: str) -> None:
    """Does nothing."""
