"""Job views read only the fields they show: a listing never moves workflows out of Redis."""

from __future__ import annotations

from pipeline.state import views
from pipeline.state.jobs import job_view
from pipeline.state.keys import JobKeys
from pipeline.state.store import Store

from .conftest import auth, job_body


def sent_bytes(store: Store) -> int:
    """Bytes redis-server has written to all its clients so far."""
    return int(store.redis.info("stats")["total_net_output_bytes"])


def test_a_listing_of_jobs_with_large_workflows_does_not_transfer_them(client, submit, tenant, store) -> None:
    key = tenant()
    workflow = {"3": {"class_type": "KSampler", "inputs": {"text": "x" * 200_000}}}
    ids = [submit(key, key=f"intent-{i}", body=job_body(workflow=workflow)).json["id"] for i in range(3)]
    assert all(store.redis.strlen(JobKeys(i).workflow) > 200_000 for i in ids)
    before = sent_bytes(store)
    listing = client.simulate_get("/v1/jobs", headers=auth(key))
    one = client.simulate_get(f"/v1/jobs/{ids[0]}", headers=auth(key))
    moved = sent_bytes(store) - before
    assert [job["id"] for job in listing.json["jobs"]] == ids[::-1]
    assert one.json["id"] == ids[0]
    assert moved < 20_000, moved  # the three workflows alone are 600 kB


def test_the_view_fields_are_every_field_job_view_reads(submit, tenant, store) -> None:
    job_id = submit(tenant()).json["id"]
    store.redis.hset(JobKeys(job_id).record, mapping={
        "charged": 7, "uncertain": 3, "error_class": "transient", "error_reason": "connect",
        "cancel_requested": "1", "obsolete": "1", "external_effect": "possible"})
    full = store.job(job_id)
    partial = views.job_record(store.redis, job_id)
    assert full is not None and partial is not None
    assert job_view(partial, {}) == job_view(full, {})
    assert views.job_record(store.redis, "acme.0123456789abcdef0123") is None
    assert [record["id"] for record, _ in views.jobs_with_outputs(
        store.redis, ["acme.0123456789abcdef0123", job_id])] == [job_id]
