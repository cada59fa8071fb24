"""The planner in the real sweeper process: a client polling a parked job sees its queue position and an ETA
range once a prompt has ended at the server (its run time measured), and none once the job completed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until
from tests.faults.conftest import Stack

JOBS = 8


def test_a_parked_job_shows_its_position_and_eta_while_queued_and_none_when_done(redis_client: Any,
                                                                                tmp_path: Path) -> None:
    stack = Stack(tmp_path, RECKON_PROVIDER_CAP="1")
    try:
        create_tenant(redis_client, "acme", 10_000)
        auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
        stack.start_provider(delay=0.4)
        stack.start_web()
        stack.start_worker()
        stack.start_sweeper()
        body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}
        locations = [stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": f"k{i}"})[1]["location"]
                     for i in range(JOBS)]

        def view(location: str) -> dict[str, Any]:
            return orjson.loads(stack.api("GET", location, **auth)[2])

        seen: dict[str, Any] = {}

        def planned() -> bool:  # the last job, still parked, with an ETA
            last = view(locations[-1])
            seen.update(last)
            return last["state"] != "queued" or (last["queue"] is not None and last["eta"] is not None)

        wait_until(planned, timeout=20, interval=0.05)
        assert seen["state"] == "queued", "the backlog drained before a plan was seen"
        assert 0 < seen["queue"]["position"] < JOBS  # the job running and the others ahead
        start, finish = seen["eta"]["start"], seen["eta"]["finish"]
        assert start["earliest"] <= start["latest"] and finish["earliest"] <= finish["latest"]
        assert start["earliest"] < finish["earliest"] and start["latest"] < finish["latest"]
        wait_until(lambda: all(view(location)["state"] == "completed" for location in locations), timeout=30)
        done = view(locations[-1])
        assert "queue" not in done and "eta" not in done
    finally:
        stack.stop(graceful=False)
