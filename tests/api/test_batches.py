"""POST /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel against a real redis-server:
per-item admission and refusals, replay, a reused key, counts, paging, cancel, tenant scope."""

from __future__ import annotations

import dataclasses
from typing import Any

from falcon import testing

from api.app import create_app
from pipeline.needs import Offer
from pipeline.state import offers
from pipeline.state.keys import TenantKeys
from pipeline.state.scripts import Scripts
from pipeline.state.store import Store

from .conftest import auth, job_body

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True

P = "urn:reckon:problem:"
MAGIC = {"1": {"class_type": "Magic", "inputs": {}}}


def post(client: testing.TestClient, api_key: str, key: str, bodies: Any) -> testing.Result:
    return client.simulate_post("/v1/batches", json={"jobs": bodies},
                                headers=auth(api_key) | {"Idempotency-Key": key})


def mixed() -> list[Any]:
    """Admitted, invalid, unsupported, admitted, over the allowance (70: two jobs of 30 fit)."""
    return [job_body(), job_body(kind="nope"), job_body(workflow=MAGIC), job_body(outputs=1, priority="batch"),
            job_body()]


def offer_all(store: Store) -> None:
    """The one server offers KSampler only: a workflow of Magic nodes is unsupported."""
    offers.write(store.redis, "sim", Offer(frozenset({"KSampler"}), {}), 1)


def test_each_item_is_admitted_or_refused_as_if_posted_alone(client, tenant, store: Store) -> None:
    key = tenant(allowance=70)
    offer_all(store)
    resp = post(client, key, "b-1", mixed())
    assert resp.status_code == 202
    batch = resp.json
    assert resp.headers["Location"] == f"/v1/batches/{batch['id']}"
    assert [item["index"] for item in batch["items"]] == [0, 1, 2, 3, 4]
    jobs = [item["job"] for item in batch["items"] if "job" in item]
    assert [j["state"] for j in jobs] == ["queued", "queued"]
    assert [j["cost"]["reserved"] for j in jobs] == [30, 30]
    problems = {item["index"]: item["problem"] for item in batch["items"] if "problem" in item}
    assert {i: (p["type"], p["status"]) for i, p in problems.items()} == {
        1: (P + "invalid-job", 422), 2: (P + "unsupported-workflow", 422), 4: (P + "insufficient-allowance", 402)}
    assert (problems[1]["field"], problems[2]["missing_node_classes"], problems[4]["available"]) == ("kind", ["Magic"], 10)
    assert store.ledger("acme")["reserved"] == 60
    assert store.redis.zcard(TenantKeys("acme").jobs) == 2
    assert store.redis.zcard(TenantKeys("acme").outbox) == 0  # both published and confirmed
    # an item's job is the job its own key names: <batch key>.<index>
    alone = client.simulate_post("/v1/jobs", json=job_body(), headers=auth(key) | {"Idempotency-Key": "b-1.0"})
    assert (alone.status_code, alone.headers["Idempotent-Replayed"], alone.json["id"]) == (202, "true", jobs[0]["id"])


def test_a_retried_batch_replays_and_a_refused_item_stays_refused(client, tenant, store: Store) -> None:
    key = tenant(allowance=70)
    offer_all(store)
    first = post(client, key, "b-2", mixed())
    store.redis.hincrby(TenantKeys("acme").ledger, "allowance", 1000)  # item 4 would fit now
    again = post(client, key, "b-2", mixed())
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (202, "true")
    assert again.content == first.content
    assert store.redis.zcard(TenantKeys("acme").jobs) == 2
    assert store.ledger("acme")["reserved"] == 60


def test_a_different_body_under_the_same_key_is_refused_and_writes_nothing(client, tenant, store: Store) -> None:
    key = tenant()
    post(client, key, "b-3", [job_body()])
    before = {k: store.redis.dump(k) for k in store.redis.keys("*") if not k.endswith(":changes")}
    resp = post(client, key, "b-3", [job_body(), job_body()])
    assert (resp.status_code, resp.json["type"]) == (422, P + "idempotency-key-reused")
    after = {k: store.redis.dump(k) for k in store.redis.keys("*") if not k.endswith(":changes")}
    assert after == before


def test_bounds_of_a_batch_are_refused_before_anything_is_written(client, tenant, store: Store) -> None:
    key = tenant()
    before = sorted(store.redis.keys("*"))
    for bodies in ([], [job_body()] * 1001, "x"):
        resp = post(client, key, "b-4", bodies)
        assert (resp.status_code, resp.json["type"], resp.json["field"]) == (422, P + "invalid-batch", "jobs")
    extra = client.simulate_post("/v1/batches", json={"jobs": [job_body()], "x": 1},
                                 headers=auth(key) | {"Idempotency-Key": "b-4"})
    assert extra.json["type"] == P + "invalid-batch"
    long_key = post(client, key, "k" * 251, [job_body()])
    assert (long_key.status_code, long_key.json["type"]) == (400, P + "idempotency-key-invalid")
    assert sorted(store.redis.keys("*")) == before


def test_a_batch_of_1000_is_admitted_in_one_request(settings, tenant, store: Store) -> None:
    client = testing.TestClient(create_app(dataclasses.replace(settings, queue_cap_interactive=4000), store=store))
    key = tenant(allowance=10**6)
    resp = post(client, key, "b-5", [job_body(workflow={"3": {"class_type": "KSampler", "inputs": {"seed": i}}})
                                     for i in range(1000)])
    assert resp.status_code == 202
    ids = [item["job"]["id"] for item in resp.json["items"]]
    assert len(set(ids)) == 1000
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1000
    assert store.ledger("acme")["reserved"] == 30_000
    cancelled = client.simulate_post(f"/v1/batches/{resp.json['id']}/cancel", headers=auth(key)).json
    assert (cancelled["cancel_requested"], cancelled["counts"]["cancelled"]) == (1000, 1000)
    assert store.ledger("acme")["reserved"] == 0


def test_counts_pages_and_cancel_of_a_batch_and_another_tenant_gets_404(client, tenant, store: Store) -> None:
    key = tenant(allowance=70)
    offer_all(store)
    batch = post(client, key, "b-6", mixed()).json
    path = f"/v1/batches/{batch['id']}"
    view = client.simulate_get(path, params={"limit": "2"}, headers=auth(key)).json
    assert (view["size"], view["counts"]["queued"], view["counts"]["refused"]) == (5, 2, 3)
    assert [i["index"] for i in view["items"]] == [0, 1] and view["next_cursor"] == "2"
    assert view["items"][0]["job"]["state"] == "queued" and view["items"][1]["problem"]["status"] == 422
    rest = client.simulate_get(path, params={"cursor": "2", "limit": "5"}, headers=auth(key)).json
    assert [i["index"] for i in rest["items"]] == [2, 3, 4] and rest["next_cursor"] is None
    other = tenant("rival")
    for method, url in (("GET", path), ("POST", path + "/cancel")):
        assert client.simulate_request(method, url, headers=auth(other)).json["type"] == P + "batch-not-found"
    assert client.simulate_get("/v1/batches/bat_nope", headers=auth(key)).status_code == 404
    cancelled = client.simulate_post(path + "/cancel", headers=auth(key))
    assert cancelled.status_code == 200
    assert (cancelled.json["cancel_requested"], cancelled.json["counts"]["cancelled"]) == (2, 2)
    assert store.ledger("acme")["reserved"] == 0
    again = client.simulate_post(path + "/cancel", headers=auth(key)).json
    assert (again["cancel_requested"], again["counts"]["cancelled"]) == (0, 2)


def test_a_batch_not_replicated_in_time_answers_503_and_its_retry_answers_the_same_jobs(settings, tenant,
                                                                                          store: Store) -> None:
    key = tenant()
    published: list[str] = []
    lagging = Store(store.redis, Scripts(store.redis, replicas=1, ack_timeout_ms=20))  # no replica: WAIT gives 0
    app = testing.TestClient(create_app(dataclasses.replace(settings, replicas_to_ack=1), store=lagging,
                                        publish=lambda job_id, _: published.append(job_id)))
    bodies = [job_body(), job_body(kind="nope"), job_body(outputs=2)]
    first = post(app, key, "b-7", bodies)
    assert (first.status_code, first.json["type"]) == (503, P + "replication-timeout")
    written = store.redis.zrange(TenantKeys("acme").jobs, 0, -1)
    assert len(written) == 2 and sorted(published) == sorted(written)  # written on the primary and sent
    assert store.redis.keys("*:batch:*") == []  # no record: the retry admits the items again
    again = post(testing.TestClient(create_app(settings, store=store, publish=lambda job_id, _: published.append(
        job_id))), key, "b-7", bodies)
    assert again.status_code == 202
    ids = [item.get("job", {}).get("id") for item in again.json["items"]]
    assert ids[1] is None and sorted(ids[0::2]) == sorted(written)
    assert again.json["items"][1]["problem"]["field"] == "kind"
    assert len(published) == 2 and store.redis.zcard(TenantKeys("acme").jobs) == 2  # replayed, not sent again
