"""POST /v1/jobs: idempotency, validation, reservation, against a real redis-server."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from falcon import testing

from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store

from .conftest import auth, job_body

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True

P = "urn:reckon:problem:"


def test_new_intent_is_accepted_with_its_reservation(client, submit, tenant, store: Store) -> None:
    key = tenant()
    resp = submit(key, body=job_body(outputs=2))
    assert resp.status_code == 202
    job = resp.json
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert "Idempotent-Replayed" not in resp.headers
    assert (job["state"], job["outputs_requested"], job["attempt_count"], job["error"]) == ("queued", 2, 0, None)
    # 2 outputs x 10 x 3 attempts
    assert job["cost"] == {"price": 10, "ceiling": 60, "reserved": 60, "uncertain": 0, "settled": 0}
    assert "workflow" not in job
    usage = client.simulate_get("/v1/usage", headers=auth(key)).json
    assert usage == {"allowance": 10_000, "reserved": 60, "uncertain": 0, "settled": 0, "available": 9_940}
    assert store.redis.zcard(TenantKeys("acme").outbox) == 0  # published and confirmed


def test_matching_retry_replays_the_first_response(client, submit, tenant, store: Store) -> None:
    key = tenant()
    first = submit(key)
    again = submit(key)
    assert again.status_code == 202
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1
    assert store.ledger("acme")["reserved"] == 30


def test_reused_key_with_other_body_is_refused(submit, tenant, store: Store) -> None:
    key = tenant()
    submit(key)
    resp = submit(key, body=job_body(outputs=3))
    assert resp.status_code == 422
    assert resp.headers["Content-Type"] == "application/problem+json"
    assert resp.json["type"] == P + "idempotency-key-reused"
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1


@pytest.mark.parametrize("idem", [None, "", "x" * 256, "has space", "semi;colon"])
def test_missing_or_malformed_key_is_400(submit, tenant, store: Store, idem) -> None:
    resp = submit(tenant(), key=idem)
    assert resp.status_code == 400
    assert resp.json["type"] == P + "idempotency-key-invalid"
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0


def test_keys_are_scoped_to_the_tenant(client, submit, tenant) -> None:
    a, b = tenant("acme"), tenant("globex")
    job_a, job_b = submit(a).json, submit(b).json
    assert job_a["id"] != job_b["id"]
    assert client.simulate_get(f"/v1/jobs/{job_a['id']}", headers=auth(b)).status_code == 404
    assert client.simulate_get(f"/v1/jobs/{job_a['id']}/events", headers=auth(b)).status_code == 404
    assert client.simulate_get(f"/v1/jobs/{job_a['id']}", headers=auth(a)).json["id"] == job_a["id"]


@pytest.mark.parametrize(
    ("body", "field", "problem"),
    [
        ([1, 2], "body", "invalid-job"),
        ({"kind": "image", "outputs": 1}, "workflow", "invalid-job"),
        (job_body(kind="video"), "kind", "invalid-job"),
        (job_body(outputs=0), "outputs", "invalid-job"),
        (job_body(outputs=17), "outputs", "invalid-job"),
        (job_body(outputs=True), "outputs", "invalid-job"),
        (job_body(priority="urgent"), "priority", "invalid-job"),
        (job_body(deadline_s=0), "deadline_s", "invalid-job"),
        (job_body(colour="red"), "colour", "invalid-job"),
        (job_body(max_cost=9), "max_cost", "max-cost-too-low"),
    ],
)
def test_invalid_job_is_422_naming_the_field(submit, tenant, store: Store, body, field, problem) -> None:
    resp = submit(tenant(), body=body)
    assert resp.status_code == 422
    assert (resp.json["type"], resp.json["field"]) == (P + problem, field)
    assert store.ledger("acme")["reserved"] == 0
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)
    assert not any(store.redis.hexists(w, "intent-1") for w in windows)


def test_unparseable_json_is_400_and_huge_body_is_413(client, tenant, store: Store) -> None:
    headers = auth(tenant()) | {"Idempotency-Key": "k", "Content-Type": "application/json"}
    bad = client.simulate_post("/v1/jobs", body=b'{"kind": ', headers=headers)
    assert (bad.status_code, bad.json["type"]) == (400, P + "malformed-json")
    huge = client.simulate_post("/v1/jobs", body=b"{" + b" " * (512 * 1024) + b"}", headers=headers)
    assert (huge.status_code, huge.json["type"]) == (413, P + "payload-too-large")
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0


def test_max_cost_lowers_the_ceiling(submit, tenant, store: Store) -> None:
    job = submit(tenant(), body=job_body(outputs=2, max_cost=45)).json
    assert job["cost"] == {"price": 10, "ceiling": 45, "reserved": 45, "uncertain": 0, "settled": 0}
    assert store.job(job["id"])["attempts_allowed"] == "2"  # 45 covers two attempts of 20


def test_not_enough_allowance_is_402_and_creates_nothing(submit, tenant, store: Store) -> None:
    resp = submit(tenant(allowance=29))
    assert resp.status_code == 402
    assert (resp.json["type"], resp.json["available"], resp.json["required"]) == (
        P + "insufficient-allowance", 29, 30)
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)
    assert not any(store.redis.hexists(w, "intent-1") for w in windows)


def test_unauthenticated_requests_are_401(client) -> None:
    resp = client.simulate_get("/v1/usage", headers={"Authorization": "Bearer nope"})
    assert (resp.status_code, resp.json["type"]) == (401, P + "unauthorized")
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.simulate_get("/v1/jobs").status_code == 401


def _race(threads: int, work) -> list[testing.Result]:
    barrier = threading.Barrier(threads)
    results: list[testing.Result] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        result = work(i)
        with lock:
            results.append(result)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


def test_concurrent_requests_on_one_key_make_exactly_one_job(submit, tenant, store: Store) -> None:
    key = tenant()
    results = _race(16, lambda i: submit(key))
    statuses = Counter(r.status_code for r in results)
    assert set(statuses) <= {202, 409}
    only_job = store.redis.zrange(TenantKeys("acme").jobs, 0, -1)[0]
    assert {r.json["id"] for r in results if r.status_code == 202} == {only_job}
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1
    assert store.ledger("acme")["reserved"] == 30
    conflicts = [r.json["type"] for r in results if r.status_code == 409]
    assert all(t == P + "idempotency-request-in-progress" for t in conflicts)


def test_concurrent_admissions_never_reserve_beyond_the_allowance(submit, tenant, store: Store) -> None:
    key = tenant(allowance=100)  # room for exactly three jobs of 30
    results = _race(20, lambda i: submit(key, key=f"intent-{i}"))
    assert Counter(r.status_code for r in results) == {202: 3, 402: 17}
    assert store.ledger("acme") == {"allowance": 100, "reserved": 90, "uncertain": 0, "settled": 0, "available": 10}
    assert store.redis.zcard(TenantKeys("acme").jobs) == 3


def test_key_may_create_a_new_job_after_retention(client, submit, tenant, store: Store) -> None:
    key = tenant()
    first = submit(key).json
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)
    for window in windows:
        store.redis.hdel(window, "intent-1")  # what its expiry does after the retention
    second = submit(key).json
    assert second["id"] != first["id"]
    [record] = [r for w in windows if (r := store.redis.hget(w, "intent-1"))]
    assert 0 <= int(record.split()[-1]) - int(store.redis.time()[0]) - 24 * 3600 <= 1  # expires in a day


def test_listing_is_newest_first_with_a_cursor_and_a_state_filter(client, submit, tenant, store: Store) -> None:
    key = tenant()
    ids = [submit(key, key=f"intent-{i}").json["id"] for i in range(5)]
    store.cancel(ids[1], now_ms=1)
    first = client.simulate_get("/v1/jobs", params={"limit": 2}, headers=auth(key)).json
    assert [j["id"] for j in first["jobs"]] == [ids[4], ids[3]]
    second = client.simulate_get("/v1/jobs", params={"limit": 2, "cursor": first["next_cursor"]},
                                 headers=auth(key)).json
    assert [j["id"] for j in second["jobs"]] == [ids[2], ids[1]]
    third = client.simulate_get("/v1/jobs", params={"limit": 2, "cursor": second["next_cursor"]},
                                headers=auth(key)).json
    assert ([j["id"] for j in third["jobs"]], third["next_cursor"]) == ([ids[0]], None)
    cancelled = client.simulate_get("/v1/jobs", params={"state": "cancelled"}, headers=auth(key)).json
    assert ([j["id"] for j in cancelled["jobs"]], cancelled["next_cursor"]) == ([ids[1]], None)
    other = client.simulate_get("/v1/jobs", headers=auth(tenant("globex"))).json
    assert other == {"jobs": [], "next_cursor": None}
    bad = client.simulate_get("/v1/jobs", params={"state": "nope"}, headers=auth(key))
    assert (bad.status_code, bad.json["field"]) == (400, "state")
