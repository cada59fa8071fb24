"""An uncertain hold stays with its attempt when reconciliation cannot interrupt it (issue 32 review).

Reconciliation finds a lost prompt still running past its job's ``max_seconds`` and interrupts it
(pipeline/work/runlimit.py). When the server refuses the interrupt (here 429, as a proxy in front of
ComfyUI answers), the prompt runs on: the attempt's outcome is as unknown as before, so it is asked
again later. Ending the attempt instead retried the job with the hold still uncertain: the next
attempt's charge then released it (booked ``uncertain:<job>:2 released``), and the first run, which the
server billed, was never booked.
"""

from __future__ import annotations

import pytest

from pipeline.errors import AttemptFailed
from pipeline.state import booked
from tests.conftest import wait_until
from tests.pipeline.test_failures import inject
from tests.pipeline.test_seconds import balanced, parts, per_second, submit  # noqa: F401 (per_second: a fixture)


def test_an_interrupt_the_server_refuses_leaves_the_attempt_to_reconciliation(store, settings, per_second) -> None:
    admit, executor, router, _ = parts(store, settings, per_second, min_attempt_seconds=0)
    per_second.sim.delay = 3.0  # the prompt runs 3 s; the job allows 1
    job_id = submit(admit, "refused-interrupt", max_seconds=1, deadline_s=600)
    inject(per_second, {"kind": "read_error", "path": "/history", "status": 0, "times": 1},
           {"kind": "control_error", "status": 429, "times": 1})
    with pytest.raises(AttemptFailed) as lost:  # the worker's first read of the prompt is lost
        executor.run(job_id)
    assert router.route(lost.value) == "reconcile"
    assert balanced(store)["uncertain"] == 7  # 1 output x 2 + 1 s x 5

    routes = []

    def ended() -> bool:
        try:
            executor.reconcile(job_id)
        except AttemptFailed as failed:
            routes.append(router.route(failed))
        return store.job(job_id)["state"] not in ("reconciling",)
    wait_until(ended, timeout=30)
    assert routes == ["dead_letter"]  # reckon's own stop, once the interrupt got through; never a retry
    [charge] = per_second.sim.charges
    job = store.job(job_id)
    assert (job["state"], job["error_reason"], job["attempt_count"]) == ("failed", "max_seconds_exceeded", "1")
    assert int(job["settled"]) == charge["units"] == balanced(store)["settled"]
    assert booked.charges(job) == [{"attempt": 1, "server": "sim", "units": charge["units"]}]
    assert booked.holds(job) == [{"attempt": 1, "server": "sim", "outcome": "released", "units": 0, "held": 7}]
