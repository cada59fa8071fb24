"""Liveness with real processes: a collect thread (the watcher's) stuck after its prompt ended (a server that
trickles an output one byte every 2 s, each byte inside the read timeout) does not keep its job
`running`. Either its download runs out of time, or the lease keeper gives the claim up past the
deadline plus the grace; the sweeper then reconciles the job as a dead worker's, charged once.
"""

from __future__ import annotations

from pipeline.state.store import Store
from tests.conftest import wait_until
from tests.faults.test_crashes import finished, setup

#: The trickle: 92 bytes (the simulator's PNG), one every 2 s: three minutes for one output.
TRICKLE = {"faults": [{"kind": "trickle", "path": "/view", "seconds": 2, "times": 1}]}
LEASE_S = 3


def trickled(stack, redis_client, deadline_s: int, **env: str) -> str:
    """A stack whose first output download trickles; one job of one output submitted to it."""
    stack.env |= {"RECKON_LEASE_SECONDS": str(LEASE_S), **env}
    auth = setup(stack, redis_client)
    stack.start_provider(delay=0.3)
    stack.sim_post("/sim/faults", TRICKLE)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "deadline_s": deadline_s}
    status, headers, _ = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "trickle-1"})
    assert status == 202
    return headers["location"].rsplit("/", 1)[1]


def collectors_log(stack) -> str:
    """The logs of the processes that collect: the watcher (pipeline/work/collecting.py) and the worker."""
    return "".join((stack.logs / f"{name}.log").read_text() for name in ("watcher", "worker"))


def at(store: Store, job_id: str, state: str) -> int:
    """When (ms, Redis's clock) the job entered ``state``."""
    return next(e["at"] for e in store.events(job_id) if e["to"] == state)


def charged_once(stack, store: Store, job_id: str) -> None:
    job = store.job(job_id)
    assert (job["state"], job["attempt_count"]) == ("completed", "1")
    assert [e["to"] for e in store.events(job_id)] == ["queued", "running", "reconciling", "completed"]
    assert [(a["state"], a.get("reconciled")) for a in store.attempts(job_id)] == [("completed", True)]
    assert sorted(store.outputs(job_id)) == [0]
    assert stack.charges()["total_units"] == 10 and len(stack.charges()["charges"]) == 1
    assert store.ledger("acme") == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 10,
                                    "available": 990}


def test_a_trickling_download_past_the_deadline_is_given_up_by_the_keeper(stack, redis_client, store) -> None:
    """The download limit is longer than the test: only the keeper's give-up ends the stuck claim."""
    job_id = trickled(stack, redis_client, deadline_s=5, RECKON_DEADLINE_GRACE_SECONDS="1",
                      RECKON_OUTPUT_FETCH_SECONDS="200", RECKON_STALL_SECONDS="400")
    wait_until(lambda: finished(store, job_id), timeout=40)
    charged_once(stack, store, job_id)
    # renewed up to the deadline plus the grace (a renewal every lease/3), then left to lapse
    late = at(store, job_id, "reconciling") - int(store.job(job_id)["deadline"])
    assert 1_000 < late < (1 + LEASE_S / 3 + LEASE_S + 2) * 1000
    log = collectors_log(stack)
    warned = [line for line in log.splitlines() if "no longer renewed" in line]
    assert len(warned) == 1 and f"lease of job {job_id} (attempt 1)" in warned[0]
    assert "its deadline passed" in warned[0] and "KSampler" not in log and "/view" not in log


def test_a_trickling_download_runs_out_of_time_and_is_reconciled(stack, redis_client, store) -> None:
    """The deadline is far: the output's download limit (2 s) ends the stuck fetch."""
    job_id = trickled(stack, redis_client, deadline_s=600, RECKON_OUTPUT_FETCH_SECONDS="2")
    wait_until(lambda: finished(store, job_id), timeout=40)
    charged_once(stack, store, job_id)
    took = at(store, job_id, "reconciling") - at(store, job_id, "running")
    assert 2_000 < took < 8_000  # the prompt (0.3 s), then the 2 s limit: not the 184 s trickle
    assert "no longer renewed" not in collectors_log(stack)
