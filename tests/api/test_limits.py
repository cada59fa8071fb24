"""Per-tenant admission limits, decided inside the admission script: jobs in flight and a
submission rate. A refused request writes nothing and answers 429 with Retry-After."""

from __future__ import annotations

import orjson
import pytest

from pipeline.errors import OverLimit
from pipeline.operate import cli
from pipeline.state import keys
from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import set_limits
from tests.api.conftest import auth


def test_jobs_in_flight_over_the_limit_are_refused_and_nothing_is_written(client, submit, tenant, store,
                                                                         capsys) -> None:
    api_key = tenant("acme", 10_000)
    assert cli.main(["tenant", "set", "acme", "--max-inflight", "2"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out)["limits"] == {"max_inflight": "2"}
    first = submit(api_key, key="k1")
    assert [first.status_code, submit(api_key, key="k2").status_code] == [202, 202]
    refused = submit(api_key, key="k3")
    assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
    assert refused.json["type"].endswith("too-many-in-flight") and refused.json["limit"] == "max_inflight"
    assert store.redis.zcard(TenantKeys("acme").jobs) == 2 and store.ledger("acme")["reserved"] == 60
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)
    assert not any(store.redis.hexists(w, "k3") for w in windows)  # the key stays free
    replay = submit(api_key, key="k1")  # a retry of an admitted request is never limited
    assert (replay.status_code, replay.headers["idempotent-replayed"]) == (202, "true")
    assert client.simulate_post(f"/v1/jobs/{first.json['id']}/cancel", headers=auth(api_key)).status_code == 200
    assert submit(api_key, key="k3").status_code == 202  # one left flight: room again
    assert store.redis.hget(keys.ShardKeys(0).stats, "refused:max_inflight") == "1"
    assert 'reckon_admission_refused_total{reason="max_inflight"} 1.0' in client.simulate_get("/metrics").text


def test_the_submission_rate_is_a_token_bucket_on_redis_time(store, tenant) -> None:
    tenant("acme", 10_000)
    assert set_limits(store.redis, "acme", rate=1.0, burst=2) == {"rate": "1.0", "burst": "2"}
    now = 1_000_000

    def admit(n: int, at: int) -> None:
        record = {"id": f"acme.{n:020x}", "tenant": "acme", "state": "queued", "priority": "batch",
                  "outputs_requested": "1", "deadline_s": "60", "reserved": "10"}
        store.admit("acme", f"k{n}", f"acme.{n:020x}", fingerprint="fp", ceiling=10, fields=record,
                    workflow=b"{}", status=202, now_ms=at, idem_ttl_s=60, outbox_delay_ms=10_000)

    admit(1, now)
    admit(2, now)  # the burst
    with pytest.raises(OverLimit) as refused:
        admit(3, now + 500)
    assert (refused.value.reason, refused.value.retry_after) == ("rate", 0.5)
    assert store.redis.hget(TenantKeys("acme").limits, "at") == str(now)  # a refusal changes no bucket
    admit(3, now + 1_000)  # one token a second
    with pytest.raises(OverLimit):
        admit(4, now + 1_999)
    admit(4, now + 2_000)
    assert store.redis.zcard(TenantKeys("acme").jobs) == 4
    assert store.redis.hget(keys.ShardKeys(0).stats, "refused:rate") == "2"
