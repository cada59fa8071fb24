"""Health, readiness and Prometheus exposition."""

from __future__ import annotations

import math

from falcon import testing

from api.app import create_app
from pipeline.state import keys
from pipeline.state.keys import TenantKeys
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
from tests.conftest import free_port

from .conftest import auth, job_body


def test_health_and_readiness(client) -> None:
    assert client.simulate_get("/healthz").json == {"status": "ok"}
    ready = client.simulate_get("/readyz").json
    assert ready["status"] == "ready" and "admit" in ready["scripts"] and "finish" in ready["scripts"]


def test_metrics_sum_every_tenant_and_name_none(client, submit, tenant, store) -> None:
    acme, globex = tenant("acme", 10_000), tenant("globex", 500)
    submit(acme)
    submit(globex, key="g-1", body=job_body(outputs=2))
    cancelled = submit(globex, key="g-2", body=job_body(outputs=2)).json["id"]
    assert client.simulate_post(f"/v1/jobs/{cancelled}/cancel", headers=auth(globex)).status_code == 200
    store.block_provider("sim", "provider_credentials", now_ms=1)
    text = client.simulate_get("/metrics").text
    assert "tenant=" not in text and "acme" not in text and "globex" not in text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("reckon_")}
    assert {k: v for k, v in samples.items() if k.startswith("reckon_jobs{") and v} == {
        'reckon_jobs{class="interactive",state="cancelled"}': 1.0,
        'reckon_jobs{class="interactive",state="queued"}': 2.0}
    assert samples['reckon_jobs_finished_total{class="interactive",error_class="none",state="cancelled"}'] == 1.0
    assert samples['reckon_time_to_completion_seconds_count{class="interactive"}'] == 1.0
    assert {k: v for k, v in samples.items() if k.startswith("reckon_exposure_units")} == {  # 30 + 60 reserved
        'reckon_exposure_units{kind="reserved"}': 90.0, 'reckon_exposure_units{kind="uncertain"}': 0.0}
    assert samples["reckon_settled_units_total"] == 0.0
    assert samples['reckon_queue_depth{class="interactive"}'] == 2.0
    assert samples['reckon_queue_depth{class="batch"}'] == 0.0
    assert 0.0 <= samples['reckon_oldest_eligible_age_seconds{class="interactive"}'] < 5.0
    assert samples['reckon_overdue_jobs{class="interactive"}'] == 0.0
    assert {k: v for k, v in samples.items() if k.startswith("reckon_provider_blocked")} == {
        'reckon_provider_blocked{provider="sim",reason="dispatch_paused"}': 0.0,
        'reckon_provider_blocked{provider="sim",reason="provider_credentials"}': 1.0,
        'reckon_provider_blocked{provider="sim",reason="provider_unreachable"}': 0.0}
    assert samples['reckon_provider_slots{kind="busy",provider="sim"}'] == 0.0
    assert samples['reckon_provider_slots{kind="cap",provider="sim"}'] == 1000.0
    assert samples['reckon_watcher_up{provider="sim"}'] == 0.0 and samples["reckon_parked_jobs"] == 0.0
    assert math.isnan(samples["reckon_sweeper_last_pass_age_seconds"])  # no sweeper ran: the alert fires
    assert samples["reckon_sweepers_alive"] == 0.0
    now = store.server_ms()  # two sweepers passing, one silent for a minute: two alive
    store.redis.hset(keys.SWEEPER, mapping={"at": now - 5_000, "at:h/1": now - 5_000, "at:h/2": now - 6_000,
                                            "at:h/3": now - 60_000})
    text = client.simulate_get("/metrics").text
    figures = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
               if line.startswith(("reckon_sweeper_last_pass_age_seconds ", "reckon_sweepers_alive "))}
    assert 5.0 <= figures["reckon_sweeper_last_pass_age_seconds"] < 8.0 and figures["reckon_sweepers_alive"] == 2
    assert store.redis.zcard(TenantKeys("acme").queued) == store.redis.zcard(TenantKeys("globex").queued) == 1


def test_a_charge_overrun_is_exported_as_a_counter(client, submit, tenant, store) -> None:
    """A run charged 12 for a job that held 10 (a dearer server than admission knew of): booked in
    full, and counted in reckon_charge_overruns_total (0 before it)."""
    def overruns() -> float:
        text = client.simulate_get("/metrics").text
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("reckon_charge_overruns_total ")))

    job_id = submit(tenant("acme", 10_000), body=job_body(outputs=1) | {"max_cost": 10}).json["id"]
    assert overruns() == 0.0
    claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id="op-1", servers={"sim": 1})
    assert claim is not None and store.charge(claim, 12) == 12
    assert overruns() == 1.0
    text = client.simulate_get("/metrics").text
    assert 'reckon_exposure_units{kind="reserved"} 12.0' in text  # the 12 spent, not the 10 held


def _commands(store: Store) -> int:
    return int(store.redis.info("stats")["total_commands_processed"])


def test_a_scrape_costs_the_same_commands_with_one_tenant_or_three_hundred(client, submit, tenant, store) -> None:
    submit(tenant("t0", 10_000))
    before = _commands(store)
    one = client.simulate_get("/metrics").text
    cost_one = _commands(store) - before
    for n in range(1, 300):
        submit(tenant(f"t{n}", 10_000), key=f"k{n}")
    before = _commands(store)
    many = client.simulate_get("/metrics").text
    assert _commands(store) - before == cost_one
    assert 'reckon_queue_depth{class="interactive"} 1.0' in one
    assert 'reckon_queue_depth{class="interactive"} 300.0' in many


def test_unreachable_state_is_a_503_problem(settings) -> None:
    down = Store(connect_url(f"redis://127.0.0.1:{free_port()}/0"))
    client = testing.TestClient(create_app(settings, store=down, publish=lambda job_id, priority: None))
    resp = client.simulate_get("/v1/usage", headers={"Authorization": "Bearer rk_x"})
    assert (resp.status_code, resp.json["type"], resp.headers["Retry-After"]) == (
        503, "urn:reckon:problem:state-unavailable", "1")
    assert client.simulate_get("/readyz").status_code == 503
    assert client.simulate_get("/healthz").status_code == 200


def test_a_web_process_given_another_shard_count_is_not_ready(store, settings) -> None:
    store.check_shards()  # the deployment has one shard
    wrong = Store(store.redis, shards=4)
    client = testing.TestClient(create_app(settings, store=wrong, publish=lambda job_id, priority: None))
    resp = client.simulate_get("/readyz")
    assert (resp.status_code, resp.json["type"], resp.json["detail"]) == (
        503, "urn:reckon:problem:not-ready", "RECKON_SHARDS is 4 but this Redis holds 1 shards")
    assert store.redis.hget(keys.ShardKeys(0).meta, "shards") == "1"  # nothing rewritten
