"""Fleet-wide admission, decided in the admission script from the global figures: a queue cap per
workload class (503), shedding batch work while interactive jobs wait past their target (503), and
refusing a job that cannot finish before its deadline (422). A refusal writes nothing but its count."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from falcon import testing

from api.app import create_app
from pipeline.operate import cli
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store

from .conftest import auth, job_body

#: The one shard of these tests' deployment.
SHARD = keys.ShardKeys(0)


@pytest.fixture
def admit(settings: Settings, store: Store):
    """Factory: a client over the given settings changes, and a submit function for it."""

    def make(**changes):
        client = testing.TestClient(create_app(dataclasses.replace(settings, **changes), store=store,
                                               publish=lambda job_id, priority: None))

        def submit(api_key: str, key: str, **body):
            return client.simulate_post("/v1/jobs", json=job_body(**body),
                                        headers={**auth(api_key), "Idempotency-Key": key})

        return submit

    return make


def _nothing_written(store: Store, tenant: str, key: str, jobs: int, reserved: int) -> None:
    assert store.redis.zcard(TenantKeys(tenant).jobs) == jobs
    assert store.ledger(tenant)["reserved"] == reserved
    windows, _ = TenantKeys(tenant).idempotency_windows(None, 24 * 3600)
    assert not any(store.redis.hexists(w, key) for w in windows)


def test_a_full_class_queue_answers_503_and_writes_nothing(admit, tenant, store, capsys) -> None:
    submit = admit(queue_cap_interactive=2)
    api_key = tenant("acme", 10_000)
    assert [submit(api_key, f"k{n}").status_code for n in (1, 2)] == [202, 202]
    refused = submit(api_key, "k3")
    assert (refused.status_code, refused.headers["retry-after"], refused.json["type"], refused.json["limit"]) == (
        503, "5", "urn:reckon:problem:queue-full", "queue_full")  # no service-time estimate yet: 5 s
    _nothing_written(store, "acme", "k3", jobs=2, reserved=60)
    assert store.redis.hget(SHARD.stats, "refused:queue_full") == "1"
    assert submit(api_key, "k1").headers["idempotent-replayed"] == "true"  # a retry is never refused
    assert submit(api_key, "b1", priority="batch").status_code == 202  # the batch queue has room
    assert cli.main(["admission", "set", "--class", "interactive", "--queue-cap", "3"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out)["interactive"]["queue_cap"] == {"value": 3, "set_by": "operator"}
    assert submit(api_key, "k3").status_code == 202  # the operator's cap, read at the next admission
    assert submit(api_key, "k4").status_code == 503


def test_batch_is_shed_while_the_oldest_interactive_job_waits_past_its_target(admit, tenant, store) -> None:
    submit = admit(interactive_target_seconds=60)
    api_key = tenant("acme", 10_000)
    assert submit(api_key, "i1").status_code == 202
    assert submit(api_key, "b1", priority="batch").status_code == 202  # the interactive job is fresh
    interactive = store.redis.zrange(SHARD.queue, 0, 0)[0]
    store.redis.zadd(SHARD.queue, {interactive: store.server_ms() - 61_000})  # it has waited 61 s
    shed = submit(api_key, "b2", priority="batch")
    assert (shed.status_code, shed.json["type"], shed.headers["retry-after"]) == (
        503, "urn:reckon:problem:load-shed", "5")
    _nothing_written(store, "acme", "b2", jobs=2, reserved=60)
    assert submit(api_key, "i2").status_code == 202  # interactive work is still admitted
    store.pause_class("interactive")  # the wait is the operator's pause: nothing to shed for
    assert submit(api_key, "b2", priority="batch").status_code == 202
    assert store.redis.hget(SHARD.stats, "refused:load_shed") == "1"


def _complete_one(store: Store, tenant_key: str, submit, *, seconds: float, key: str, priority: str) -> None:
    """Run one job through claim and finish on a clock that says it held its slot ``seconds``."""
    job_id = submit(tenant_key, key, priority=priority).json["id"]
    start = store.server_ms()
    claim = store.claim(job_id, worker="w", lease_ms=3_600_000, operation_id=f"op-{key}",
                        servers={"sim": 1000}, now_ms=start)
    assert claim is not None
    store.store_output(claim, 0, {"sha256": "a" * 64}, now_ms=start)
    store.finish(claim, "completed", now_ms=start + int(seconds * 1000))


def test_a_job_that_cannot_meet_its_deadline_is_refused_with_the_estimate(admit, tenant, store) -> None:
    submit = admit(providers="sim=http://127.0.0.1:9;cap=2")
    api_key = tenant("acme", 10_000)
    assert submit(api_key, "early", deadline_s=1).status_code == 202  # no estimate yet: nothing to refuse on
    store.cancel(store.redis.zrange(SHARD.queue, 0, 0)[0])
    _complete_one(store, api_key, submit, seconds=50, key="c1", priority="interactive")
    _complete_one(store, api_key, submit, seconds=100, key="c2", priority="interactive")
    assert store.redis.hget(SHARD.stats, "service_ms:interactive") == "60000"  # 50 s, then a fifth towards 100 s
    refused = submit(api_key, "late", deadline_s=59)
    assert (refused.status_code, refused.json["type"], refused.json["estimate_seconds"],
            refused.json["deadline_seconds"]) == (422, "urn:reckon:problem:deadline-infeasible", 60.0, 59.0)
    _nothing_written(store, "acme", "late", jobs=3, reserved=0)
    assert submit(api_key, "q1", deadline_s=60).status_code == 202  # 60 s: just in time
    # one job queued ahead on 2 slots: 60 * (1 + 1/2) = 90 s
    assert submit(api_key, "q2", deadline_s=89).json["estimate_seconds"] == 90.0
    assert submit(api_key, "q2", deadline_s=90).status_code == 202
    assert submit(api_key, "b1", priority="batch", deadline_s=1).status_code == 202  # batch: no estimate yet
    assert store.redis.hget(SHARD.stats, "refused:deadline_infeasible") == "2"
    # Retry-After of a full queue is one slot's turn: 60 s over 2 slots
    full = admit(providers="sim=http://127.0.0.1:9;cap=2", queue_cap_interactive=2)(api_key, "q3")
    assert (full.status_code, full.headers["retry-after"]) == (503, "30")


def test_batch_feasibility_prices_each_class_ahead_at_its_own_estimate(admit, tenant, store) -> None:
    submit = admit(providers="sim=http://127.0.0.1:9;cap=2", interactive_target_seconds=10**6)
    api_key = tenant("acme", 100_000)
    _complete_one(store, api_key, submit, seconds=1, key="i", priority="interactive")
    _complete_one(store, api_key, submit, seconds=100, key="b", priority="batch")
    assert [submit(api_key, f"q{n}").status_code for n in range(40)] == [202] * 40
    # 100 s of its own after 40 interactive jobs of 1 s each over 2 slots: 120 s
    assert submit(api_key, "late", priority="batch", deadline_s=119).json["estimate_seconds"] == 120.0
    assert submit(api_key, "b1", priority="batch", deadline_s=120).status_code == 202
    store.pause_class("interactive")  # batch now goes first: only the batch job ahead counts
    assert submit(api_key, "b2", priority="batch", deadline_s=149).json["estimate_seconds"] == 150.0
    assert submit(api_key, "b2", priority="batch", deadline_s=150).status_code == 202


def test_operator_settings_that_are_not_numbers_are_ignored(admit, tenant, store, capsys) -> None:
    submit = admit(queue_cap_interactive=1)
    api_key = tenant("acme", 10_000)
    store.redis.hset(SHARD.admission, mapping={"queue_cap:interactive": "lots", "target_s:interactive": "30s"})
    assert [submit(api_key, f"k{n}").status_code for n in (1, 2)] == [202, 503]  # the default cap, 1
    assert submit(api_key, "b1", priority="batch").status_code == 202  # the default target, not a 500
    assert cli.main(["admission", "show"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out)["interactive"]["queue_cap"] == {
        "value": 1000, "set_by": "environment", "ignored": "lots"}  # the CLI's environment: the default


def test_superseding_a_queued_job_at_the_cap_is_admitted(admit, tenant, store) -> None:
    submit = admit(queue_cap_interactive=1)
    api_key = tenant("acme", 10_000)
    first = submit(api_key, "v1").json["id"]
    replaced = submit(api_key, "v2", supersedes=first)
    assert replaced.status_code == 202 and store.job(first)["state"] == "cancelled"
    assert store.redis.zrange(SHARD.queue, 0, -1) == [replaced.json["id"]]
    assert submit(api_key, "v3").status_code == 503
