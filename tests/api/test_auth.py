"""Keys and tenants as the API sees them: revoked keys and disabled tenants get 401 everywhere, within
the time a web process trusts a key it looked up (RECKON_AUTH_CACHE_SECONDS)."""

from __future__ import annotations

import dataclasses

import falcon
import pytest
from falcon import testing

from api.app import create_app
from api.auth import Authenticate
from pipeline.state import keys
from pipeline.state.tenants import create_key, hash_key, revoke_key, set_disabled

from .conftest import auth, job_body


@pytest.fixture
def client(settings, store) -> testing.TestClient:
    """The app trusting no key past its request: a refusal shows at once."""
    return testing.TestClient(create_app(dataclasses.replace(settings, auth_cache_seconds=0), store=store))


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


class Tenant:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"tenant": req.context.tenant}


def lookups(store) -> int:
    stats = store.redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("get", "exists"))


@pytest.mark.parametrize("refused", ["disabled tenant", "revoked key"])
def test_a_key_found_valid_is_trusted_for_its_time_and_refused_after_it(store, tenant, refused) -> None:
    now = [1000.0]
    app = falcon.App(middleware=[Authenticate(store.redis, trust_seconds=1.0, clock=lambda: now[0])])
    app.add_route("/t", Tenant())
    client = testing.TestClient(app)
    key = tenant("acme")
    before = lookups(store)
    assert [client.simulate_get("/t", headers=auth(key)).json for _ in range(5)] == [{"tenant": "acme"}] * 5
    assert lookups(store) - before == 2  # one lookup: the key's tenant and whether it is disabled
    if refused == "disabled tenant":
        set_disabled(store.redis, "acme", True)
    else:
        revoke_key(store.redis, key)
    now[0] += 0.999
    before = lookups(store)
    assert client.simulate_get("/t", headers=auth(key)).status_code == 200  # trusted still
    assert lookups(store) == before
    now[0] += 0.002
    assert client.simulate_get("/t", headers=auth(key)).status_code == 401
    assert client.simulate_get("/t", headers=auth(key)).status_code == 401  # a refusal is not kept: looked up again
    assert lookups(store) - before == (4 if refused == "disabled tenant" else 2)


def test_a_key_found_unknown_works_as_soon_as_it_exists(store, tenant) -> None:
    app = falcon.App(middleware=[Authenticate(store.redis, trust_seconds=5.0)])
    app.add_route("/t", Tenant())
    client = testing.TestClient(app)
    tenant("acme")
    assert client.simulate_get("/t", headers=auth("rk_not_yet")).status_code == 401
    store.redis.set(keys.api_key(hash_key("rk_not_yet")), "acme")  # as create_key writes it
    assert client.simulate_get("/t", headers=auth("rk_not_yet")).json == {"tenant": "acme"}
