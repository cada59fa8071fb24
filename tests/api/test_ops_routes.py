"""Health, readiness and Prometheus exposition."""

from __future__ import annotations

from falcon import testing

from api.app import create_app
from pipeline.keys import TenantKeys
from pipeline.store import Store, connect
from tests.conftest import free_port


def test_health_and_readiness(client) -> None:
    assert client.simulate_get("/healthz").json == {"status": "ok"}
    ready = client.simulate_get("/readyz").json
    assert ready["status"] == "ready" and "admit" in ready["scripts"] and "finish" in ready["scripts"]


def test_metrics_expose_states_ledgers_and_indexes(client, submit, tenant, store) -> None:
    key = tenant()
    submit(key)
    store.block_provider("comfyui", "provider_credentials", now_ms=1)
    text = client.simulate_get("/metrics").text
    assert 'reckon_jobs{state="queued",tenant="acme"} 1.0' in text
    assert 'reckon_ledger_units{kind="reserved",tenant="acme"} 30.0' in text
    assert 'reckon_index_jobs{index="queued",tenant="acme"} 1.0' in text
    assert 'reckon_index_jobs{index="outbox",tenant="acme"} 0.0' in text
    assert 'reckon_provider_blocked{provider="comfyui"} 1.0' in text
    assert store.redis.zcard(TenantKeys("acme").queued) == 1


def test_unreachable_state_is_a_503_problem(settings) -> None:
    down = Store(connect(f"redis://127.0.0.1:{free_port()}/0"))
    client = testing.TestClient(create_app(settings, store=down, publish=lambda job_id, priority: None))
    resp = client.simulate_get("/v1/usage", headers={"Authorization": "Bearer rk_x"})
    assert (resp.status_code, resp.json["type"], resp.headers["Retry-After"]) == (
        503, "urn:reckon:problem:state-unavailable", "1")
    assert client.simulate_get("/readyz").status_code == 503
    assert client.simulate_get("/healthz").status_code == 200
