"""POST /v1/jobs/{id}/cancel and supersedes, over the API."""

from __future__ import annotations

from pipeline.state.keys import JobKeys
from pipeline.state.store import Store

from .conftest import auth, job_body

P = "urn:reckon:problem:"


def test_cancel_a_queued_job_releases_its_reservation(client, submit, tenant, store: Store) -> None:
    key = tenant()
    job = submit(key).json
    first = client.simulate_post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    again = client.simulate_post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    assert (first.status_code, again.status_code) == (200, 200)
    assert (first.json["state"], first.json["external_effect"], first.json["cost"]["reserved"]) == (
        "cancelled", "none", 0)
    assert again.json == first.json | {"updated_at": again.json["updated_at"]}
    assert client.simulate_get("/v1/usage", headers=auth(key)).json["reserved"] == 0
    assert [e["to"] for e in client.simulate_get(f"/v1/jobs/{job['id']}/events", headers=auth(key)).json["events"]] \
        == ["queued", "cancelled"]


def test_cancel_a_running_job_is_a_request(client, submit, tenant, store: Store) -> None:
    key = tenant()
    job_id = submit(key).json["id"]
    claim = store.claim(job_id, worker="w", now_ms=1, lease_ms=10**13, operation_id="op", servers={"sim": 1000})
    store.mark_submit(claim, now_ms=2, epoch="e", lease_ms=10**13)
    resp = client.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert resp.status_code == 202
    assert (resp.json["state"], resp.json["cancel_requested"], resp.json["external_effect"]) == (
        "running", True, "possible")


def test_cancel_a_finished_or_foreign_job_is_refused(client, submit, tenant, store: Store) -> None:
    key, other = tenant("acme"), tenant("globex")
    job_id = submit(key).json["id"]
    claim = store.claim(job_id, worker="w", now_ms=1, lease_ms=10**13, operation_id="op", servers={"sim": 1000})
    store.finish(claim, "failed", now_ms=2, error_class="policy_rejected")
    resp = client.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=auth(key))
    assert (resp.status_code, resp.json["type"], resp.json["state"]) == (409, P + "job-finished", "failed")
    assert client.simulate_post(f"/v1/jobs/{job_id}/cancel", headers=auth(other)).status_code == 404


def test_supersedes_cancels_the_older_queued_job(client, submit, tenant) -> None:
    key = tenant()
    older = submit(key, key="v1").json["id"]
    newer = submit(key, key="v2", body=job_body(supersedes=older)).json["id"]
    old = client.simulate_get(f"/v1/jobs/{older}", headers=auth(key)).json
    assert (old["state"], old["obsolete"]) == ("cancelled", False)
    assert client.simulate_get(f"/v1/jobs/{newer}", headers=auth(key)).json["state"] == "queued"
    assert client.simulate_get("/v1/usage", headers=auth(key)).json["reserved"] == 30
    foreign = submit(tenant("globex"), key="g1").json["id"]
    refused = submit(key, key="v3", body=job_body(supersedes=foreign))
    assert (refused.status_code, refused.json["field"]) == (422, "supersedes")


#: Each job route, and what it answers when the job is purged right after the resource first reads
#: it: the job view answers from that first read (one record read); every other route finds it gone
#: (404), never an empty list that says the job had no attempts or events.
PURGED_MIDWAY = {
    ("post", "/cancel"): (404, P + "job-not-found"),
    ("get", ""): (200, None),
    ("get", "/attempts"): (404, P + "job-not-found"),
    ("get", "/events"): (404, P + "job-not-found"),
    ("get", "/events/stream"): (404, P + "job-not-found"),
    ("get", "/outputs/0"): (404, P + "output-not-found"),
}


def test_each_job_route_answers_a_job_purged_between_its_reads(client, submit, tenant, store: Store,
                                                                 monkeypatch) -> None:
    from api import resources

    key = tenant()
    read_then_purge = resources.owned_job

    def owned_then_purged(store_: Store, tenant_: str, job_id: str) -> dict[str, str]:
        record = read_then_purge(store_, tenant_, job_id)
        assert store_.purge(job_id, retention_ms=0, now_ms=10**13)  # the sweeper, between the two reads
        return record

    monkeypatch.setattr(resources, "owned_job", owned_then_purged)
    answers = {}
    for number, (method, path) in enumerate(PURGED_MIDWAY):
        job_id = submit(key, key=f"purged-{number}").json["id"]
        claim = store.claim(job_id, worker="w", now_ms=1, lease_ms=10**13, operation_id="op", servers={"sim": 1000})
        store.finish(claim, "failed", now_ms=2, error_class="policy_rejected")
        resp = getattr(client, f"simulate_{method}")(f"/v1/jobs/{job_id}{path}", headers=auth(key))
        answers[method, path] = (resp.status_code, resp.json.get("type") if resp.status_code >= 400 else None)
        assert not store.redis.exists(JobKeys(job_id).record)
    assert answers == PURGED_MIDWAY
