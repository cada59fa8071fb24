"""A long attempt stays leased by its heartbeats, and outputs copied before its worker dies are
recorded."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.providers import sim as simulated
from tests.conftest import wait_until
from tests.pipeline.test_failures import sweep

BOTH_BACKENDS = True


def test_heartbeats_keep_a_long_attempt_leased(store, settings, admit, make_executor) -> None:
    server = simulated.start(delay=4.0)
    try:
        job_id = admit()
        executor = make_executor(server, lease_seconds=1.5)
        runner = threading.Thread(target=executor.run, args=(job_id,))
        runner.start()
        wait_until(lambda: server.sim.queue()["queue_running"])
        time.sleep(2.5)  # longer than the lease: only heartbeats keep it alive
        assert sweep(store, settings).get("leases_expired", 0) == 0
        runner.join(timeout=10)
    finally:
        server.close()
    assert store.job(job_id)["state"] == "completed" and len(store.attempts(job_id)) == 1


class Killed(BaseException):
    """A SIGKILL's stand-in inside one process: no ``except Exception`` runs."""


def test_outputs_copied_before_the_worker_dies_are_recorded(store, admit, make_executor, sim) -> None:
    """Each output is recorded right after its copy: a worker that dies during its third copy leaves the
    first two recorded (paid outputs the provider may not keep)."""
    job_id = admit(outputs=3)
    executor = make_executor(sim)
    put, copies = executor.blobs.put, []

    def put_then_die(data: bytes) -> str:
        copies.append(data)
        if len(copies) == 3:
            raise Killed()
        return put(data)

    executor.blobs.put = put_then_die
    with pytest.raises(Killed):
        executor.run(job_id)
    assert store.job(job_id)["attempt_charged"] == "1"  # booked before the outputs
    assert sorted(store.outputs(job_id)) == [0, 1]
