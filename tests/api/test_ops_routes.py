"""Health, readiness and Prometheus exposition."""

from __future__ import annotations

from pipeline.keys import TenantKeys


def test_health_and_readiness(client) -> None:
    assert client.simulate_get("/healthz").json == {"status": "ok"}
    ready = client.simulate_get("/readyz").json
    assert ready["status"] == "ready" and "admit" in ready["scripts"] and "finish" in ready["scripts"]


def test_metrics_expose_states_ledgers_and_indexes(client, submit, tenant, store) -> None:
    key = tenant()
    submit(key)
    store.mark_provider_auth_failed("comfyui", now_ms=1)
    text = client.simulate_get("/metrics").text
    assert 'reckon_jobs{state="queued",tenant="acme"} 1.0' in text
    assert 'reckon_ledger_units{kind="reserved",tenant="acme"} 30.0' in text
    assert 'reckon_index_jobs{index="queued",tenant="acme"} 1.0' in text
    assert 'reckon_index_jobs{index="outbox",tenant="acme"} 0.0' in text
    assert 'reckon_provider_blocked{provider="comfyui"} 1.0' in text
    assert store.redis.zcard(TenantKeys("acme").queued) == 1
