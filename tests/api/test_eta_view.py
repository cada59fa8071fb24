"""``queue`` and ``eta`` in ``GET /v1/jobs/{id}`` (docs/api.md "Queue position and ETA"), in process: a queued job
before and after a plan names it, and a cancelled one, which shows neither."""

from __future__ import annotations

from typing import Any

from falcon import testing

from pipeline.state import plans
from pipeline.state.ids import tenant_of
from pipeline.state.keys import JobKeys
from pipeline.state.plans import Plan
from tests.api.conftest import auth


def test_a_queued_job_shows_its_plan_and_a_cancelled_one_none(client: testing.TestClient, submit: Any,
                                                               tenant: Any, redis_client: Any) -> None:
    key = tenant()
    job_id = submit(key).json["id"]
    path = f"/v1/jobs/{job_id}"
    view = client.simulate_get(path, headers=auth(key)).json
    assert (view["state"], view["queue"], view["eta"]) == ("queued", None, None)  # no pass planned it yet
    at = 1_800_000_000_000
    plans.write(redis_client, JobKeys(job_id).shard, {job_id: Plan(2, (at, at + 3000), (at + 1500, at + 6000))}, {})
    view = client.simulate_get(path, headers=auth(key)).json
    assert view["queue"] == {"position": 2}
    assert view["eta"] == {"start": {"earliest": "2027-01-15T08:00:00.000Z", "latest": "2027-01-15T08:00:03.000Z"},
                           "finish": {"earliest": "2027-01-15T08:00:01.500Z", "latest": "2027-01-15T08:00:06.000Z"}}
    assert tenant_of(job_id) == "acme"
    assert client.simulate_post(f"{path}/cancel", headers=auth(key)).status_code == 200
    view = client.simulate_get(path, headers=auth(key)).json
    assert view["state"] == "cancelled" and "queue" not in view and "eta" not in view
