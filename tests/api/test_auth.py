"""Keys and tenants as the API sees them: revoked keys and disabled tenants get 401 everywhere."""

from __future__ import annotations

import pytest

from pipeline.tenants import create_key, revoke_key, set_disabled

from .conftest import auth, job_body


def routes(job_id: str) -> list[tuple[str, str]]:
    return [("GET", "/v1/usage"), ("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/attempts"), ("GET", f"/v1/jobs/{job_id}/events"),
            ("GET", f"/v1/jobs/{job_id}/outputs/0"), ("POST", f"/v1/jobs/{job_id}/cancel"), ("POST", "/v1/jobs")]


def call(client, method: str, path: str, api_key: str):
    headers = auth(api_key) | {"Idempotency-Key": "intent-2"}
    return client.simulate_request(method, path, headers=headers, json=job_body() if method == "POST" else None)


@pytest.mark.parametrize("refused", ["disabled tenant", "revoked key"])
def test_refused_keys_get_401_on_every_route_and_change_nothing(client, submit, tenant, store, refused) -> None:
    key, other = tenant("acme"), tenant("globex")
    job_id = submit(key).json["id"]
    spare = create_key(store.redis, "acme")
    if refused == "disabled tenant":
        set_disabled(store.redis, "acme", True)
    else:
        revoke_key(store.redis, key)
    for method, path in routes(job_id):
        resp = call(client, method, path, key)
        assert (resp.status_code, resp.json["type"]) == (401, "urn:reckon:problem:unauthorized"), (method, path)
    assert store.job(job_id)["state"] == "queued"
    assert store.ledger("acme")["reserved"] == 30
    assert client.simulate_get("/v1/usage", headers=auth(other)).status_code == 200
    spare_status = client.simulate_get(f"/v1/jobs/{job_id}", headers=auth(spare)).status_code
    assert spare_status == (401 if refused == "disabled tenant" else 200)


def test_an_enabled_tenant_is_served_again(client, submit, tenant, store) -> None:
    key = tenant()
    set_disabled(store.redis, "acme", True)
    assert submit(key).status_code == 401
    set_disabled(store.redis, "acme", False)
    assert submit(key).status_code == 202
