"""The webhook outbox and deliveries on a real Redis: the event is written by the step that changes the
state, fanned out once per endpoint, taken under a lease, sent in order per job, exhausted, redelivered."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from pipeline.state.keys import ShardKeys, TenantKeys
from pipeline.state.store import Store
from pipeline.webhooks.deliveries import Deliveries, Took, message_id
from pipeline.webhooks.endpoints import EndpointNotFound, Endpoints

URL = "https://hooks.example.com/reckon"
A, B = "acme." + "a" * 20, "acme." + "b" * 20
WINDOW_MS = 60_000


def outbox(store: Store) -> list[dict[str, Any]]:
    shard = TenantKeys("acme").shard
    return [orjson.loads(raw) for raw in store.redis.lrange(shard.webhook_outbox, 0, -1)]


def fan_out(store: Store) -> int:
    shard = TenantKeys("acme").shard
    deliveries, endpoints = Deliveries(store), Endpoints(store)
    handled = 0
    while deliveries.move_one(shard, 0.01) or store.redis.llen(shard.webhook_taking):
        handled += deliveries.fan_out(shard, endpoints.all)
    return handled


def take(store: Store, most: int = 100, free: dict[str, int] | None = None, lease_ms: int = 30_000):
    """(taken, None, earliest due): what a webhooks process with 4 places per endpoint (or ``free``) takes."""
    took = Deliveries(store).take(TenantKeys("acme").shard, lambda endpoint: ((free or {}).get(endpoint, 4), 0),
                                  most=most, lease_ms=lease_ms, window_ms=WINDOW_MS)
    return took.taken, None, took.earliest


def test_a_state_change_writes_its_webhook_event_in_the_same_step(store: Store, admit) -> None:
    job_before = admit("before")
    store.cancel(job_before)
    assert outbox(store) == []  # no endpoint when it was admitted: no event
    Endpoints(store).add("acme", URL, ["job.cancelled", "job.completed"])
    job = admit("after")
    assert outbox(store) == []  # queued is no webhook event
    store.cancel(job)
    [event] = outbox(store)
    assert (event["job"], event["tenant"], event["type"], event["to"], event["from"], event["reason"]) == \
        (job, "acme", "job.cancelled", "cancelled", "queued", "cancelled")
    assert event["seq"] == 2 and event["attempt"] == 0


def test_each_endpoint_gets_one_delivery_per_event_and_a_second_fan_out_adds_none(store: Store, admit) -> None:
    endpoints = Endpoints(store)
    first, _ = endpoints.add("acme", URL, ["job.cancelled"])
    second, _ = endpoints.add("acme", URL + "/2", ["job.cancelled", "job.failed"])
    endpoints.add("acme", URL + "/3", ["job.completed"])
    job = admit("one")
    store.cancel(job)
    assert fan_out(store) == 1
    taken, _, _ = take(store)
    assert sorted((t.endpoint, t.message, t.attempts) for t in taken) == sorted(
        [(first["id"], f"msg_{job}.2", 1), (second["id"], f"msg_{job}.2", 1)])
    body = orjson.loads(taken[0].body)
    assert (body["type"], body["data"]["id"], body["data"]["state"], body["data"]["event"]["seq"]) == \
        ("job.cancelled", job, "cancelled", 2)
    assert "workflow" not in taken[0].body.decode()
    assert taken[0].body == taken[1].body
    # the same events again (a process died after its fan-out, before trimming): nothing new
    shard = TenantKeys("acme").shard
    store.redis.rpush(shard.webhook_taking, orjson.dumps({**outbox_event(job, 2), "tenant": "acme"}))
    assert Deliveries(store).fan_out(shard, endpoints.all) == 1
    assert take(store)[0] == []  # both are leased; no third delivery


def outbox_event(job: str, seq: int) -> dict[str, Any]:
    return {"job": job, "tenant": "acme", "type": "job.cancelled", "seq": seq, "at": 1, "attempt": 0,
            "from": "queued", "to": "cancelled", "reason": "cancelled"}


def push(store: Store, *events: dict[str, Any]) -> None:
    store.redis.rpush(TenantKeys("acme").shard.webhook_outbox, *(orjson.dumps(e) for e in events))


def settle(store: Store, taken, outcome: str, delay_ms: int = 0) -> str | None:
    recorded, _ = Deliveries(store).settle(TenantKeys("acme").shard, taken, outcome, delay_ms=delay_ms,
                                           error="HTTP 500", status=500, window_ms=WINDOW_MS)
    return recorded


def test_a_jobs_deliveries_to_an_endpoint_go_one_at_a_time_in_order(store: Store, tenant) -> None:
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1), outbox_event(B, 1), outbox_event(A, 2),
         outbox_event(A, 3))
    assert fan_out(store) == 4
    taken, _, _ = take(store)
    assert [t.message for t in taken] == [f"msg_{A}.1", f"msg_{B}.1"]  # a.2 waits behind a.1
    first = taken[0]
    assert settle(store, first, "retry", delay_ms=0) == "retry"
    again, _, _ = take(store)
    assert [(t.message, t.attempts) for t in again] == [(f"msg_{A}.1", 2)]
    assert Deliveries(store).settle(TenantKeys("acme").shard, again[0], "delivered", window_ms=WINDOW_MS) == \
        ("delivered", True)  # the job's next one became due
    assert [t.message for t in take(store)[0]] == [f"msg_{A}.2"]
    assert store.redis.hexists(TenantKeys("acme").shard.webhook_order, f"{endpoint['id']}/{A}")


def test_an_outcome_under_a_lapsed_lease_changes_nothing(store: Store, tenant) -> None:
    tenant()
    Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1))
    fan_out(store)
    shard = TenantKeys("acme").shard
    deliveries = Deliveries(store)
    [old], _, _ = take(store, lease_ms=1)
    store.redis.zadd(shard.webhook_due(old.endpoint), {old.member: 0})  # its lease ended: due again
    [new], _, _ = take(store)
    assert (new.member, new.attempts) == (old.member, 2) and new.lease != old.lease
    assert settle(store, old, "delivered") is None  # the late outcome of the first try
    assert store.redis.hexists(shard.webhook_deliveries, new.member)
    assert settle(store, new, "delivered") == "delivered"
    assert not store.redis.hexists(shard.webhook_deliveries, new.member)
    assert store.redis.zcard(shard.webhook_due(new.endpoint)) == 0 and store.redis.zcard(shard.webhook_ready) == 0


def test_a_delivery_past_its_window_is_exhausted_listed_and_redelivered(store: Store, tenant) -> None:
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1), outbox_event(A, 2))
    fan_out(store)
    [first], _, _ = take(store)
    assert settle(store, first, "retry", delay_ms=WINDOW_MS + 1) == "exhausted"
    deliveries = Deliveries(store)
    [row] = deliveries.exhausted("acme", endpoint["id"])
    assert (row["id"], row["job_id"], row["attempts"], row["last_status"], row["last_error"]) == \
        (f"msg_{A}.1", A, 1, 500, "HTTP 500")
    [second], _, _ = take(store)  # the job's next event no longer waits
    assert second.message == f"msg_{A}.2"
    assert deliveries.redeliver("acme", endpoint["id"]) == 1
    assert deliveries.exhausted("acme", endpoint["id"]) == []
    [again], _, _ = take(store)
    assert (again.message, again.attempts, again.body) == (f"msg_{A}.1", 1, first.body)
    assert deliveries.redeliver("acme", endpoint["id"]) == 0


def test_an_endpoints_free_places_bound_what_is_taken(store: Store, tenant) -> None:
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, *(outbox_event(f"acme.{i:020x}", 1) for i in range(6)))
    fan_out(store)
    assert len(take(store, free={endpoint["id"]: 2})[0]) == 2
    assert take(store, free={endpoint["id"]: 0})[0] == []  # its places are taken
    assert len(take(store)[0]) == 4  # the default: 4 places


def test_removing_an_endpoint_drops_its_deliveries_and_its_types(store: Store, admit) -> None:
    endpoints = Endpoints(store)
    endpoint, _ = endpoints.add("acme", URL, ["job.cancelled", "job.progress"])
    assert store.redis.hget(TenantKeys("acme").limits, "hooks") == ",job.cancelled,job.progress,"
    push(store, outbox_event(A, 1))
    fan_out(store)
    endpoints.remove("acme", endpoint["id"])
    assert store.redis.hget(TenantKeys("acme").limits, "hooks") is None
    with pytest.raises(EndpointNotFound):
        endpoints.remove("acme", endpoint["id"])
    job = admit("after-removal")
    store.cancel(job)
    assert outbox(store) == []


def test_a_rotated_secret_signs_until_its_overlap_ends(store: Store, tenant) -> None:
    from pipeline.webhooks.endpoints import signing_secrets

    tenant()
    endpoints = Endpoints(store)
    endpoint, first = endpoints.add("acme", URL, ["job.failed"])
    rotated, second = endpoints.rotate("acme", endpoint["id"], overlap_seconds=60)
    now = store.server_ms(TenantKeys("acme").shard)
    assert first != second and signing_secrets(rotated, now) == [second, first]
    assert signing_secrets(rotated, now + 61_000) == [second]
    assert endpoints.get("acme", endpoint["id"])["secrets"] == rotated["secrets"]


def test_message_ids_are_stable_per_job_event(store: Store) -> None:
    assert message_id(outbox_event(A, 7)) == f"msg_{A}.7"
    assert ShardKeys(0).webhook_exhausted("wh_1") == "reckon:{s0}:webhooks:exhausted:wh_1"


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_on_a_cluster_with_shards_each_step_stays_on_its_shards_node(store: Store, admit, shards: int) -> None:
    """Every key of a webhook step carries its shard's tag: a Cluster runs each script on one node."""
    from pipeline.state import keys
    from pipeline.webhooks.deliveries import backlog

    keys.use_shards(3)
    try:
        Endpoints(store).add("acme", URL, ["job.cancelled"])
        job = admit("clustered")
        store.cancel(job)
        assert backlog(store.redis).events == 1
        assert fan_out(store) == 1
        [taken], _, _ = take(store)
        assert backlog(store.redis).kept == 1
        assert settle(store, taken, "delivered") == "delivered"
        assert backlog(store.redis) == type(backlog(store.redis))(0, 0, 0.0)
    finally:
        keys.use_shards(shards)


def test_a_redelivered_event_moves_no_line_of_its_job(store: Store, tenant) -> None:
    """An exhausted event sent again while the job's later events wait in line: its outcome leaves the
    line to the delivery at its head."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1))
    fan_out(store)
    [first], _, _ = take(store)
    assert settle(store, first, "retry", delay_ms=WINDOW_MS + 1) == "exhausted"
    push(store, outbox_event(A, 2), outbox_event(A, 3))
    fan_out(store)
    Deliveries(store).redeliver("acme", endpoint["id"])
    taken, _, _ = take(store)
    assert sorted(t.message for t in taken) == [f"msg_{A}.1", f"msg_{A}.2"]  # 3 waits behind 2
    again = next(t for t in taken if t.message == f"msg_{A}.1")
    assert settle(store, again, "delivered") == "delivered"
    assert take(store)[0] == []  # 3 still waits: 2 is in flight
    head = next(t for t in taken if t.message == f"msg_{A}.2")
    assert settle(store, head, "delivered") == "delivered"
    assert [t.message for t in take(store)[0]] == [f"msg_{A}.3"]


def test_one_endpoints_backlog_never_hides_another_endpoints_delivery(store: Store, tenant) -> None:
    """500 deliveries due to an endpoint with no free place ahead of one to another: that one is taken."""
    tenant()
    endpoints = Endpoints(store)
    busy, _ = endpoints.add("acme", URL, ["job.cancelled"])
    push(store, *(outbox_event(f"acme.{i:020x}", 1) for i in range(500)))
    fan_out(store)
    quiet, _ = endpoints.add("acme", URL + "/quiet", ["job.failed"])
    push(store, {**outbox_event(B, 1), "type": "job.failed"})
    fan_out(store)
    [taken], _, _ = take(store, free={busy["id"]: 0})
    assert taken.endpoint == quiet["id"]


def test_an_open_circuit_keeps_its_endpoint_out_of_takes_until_it_closes(store: Store, tenant) -> None:
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1))
    fan_out(store)
    shard, deliveries = TenantKeys("acme").shard, Deliveries(store)
    closed = store.server_ms(shard) + 60_000
    took = deliveries.take(shard, lambda e: (0, closed), most=10, lease_ms=30_000, window_ms=WINDOW_MS)
    assert took == Took([], closed, [])
    assert store.redis.zscore(shard.webhook_ready, endpoint["id"]) == closed


def test_the_retry_window_starts_at_the_first_try_not_at_fan_out(store: Store, tenant) -> None:
    """A delivery that waited in its job's line longer than the window still gets its tries."""
    tenant()
    Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1), outbox_event(A, 2))
    fan_out(store)
    [first], _, _ = take(store)
    settle(store, first, "delivered")
    deliveries = Deliveries(store)
    shard = TenantKeys("acme").shard
    raw = orjson.loads(store.redis.hget(shard.webhook_deliveries, f"{first.endpoint}/msg_{A}.2"))
    assert "first_at" not in raw  # not tried yet
    [second], _, _ = take(store)
    recorded, _ = deliveries.settle(shard, second, "retry", delay_ms=WINDOW_MS - 1_000, window_ms=WINDOW_MS)
    assert recorded == "retry"


def test_a_newer_progress_point_replaces_the_one_waiting_in_line(store: Store, tenant) -> None:
    """A job's line holds its state events and one progress point: a slow endpoint gets the newest."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.progress", "job.completed"])
    progress = [{**outbox_event(A, seq), "type": "job.progress"} for seq in range(1, 6)]
    push(store, *progress, {**outbox_event(A, 6), "type": "job.completed"})
    fan_out(store)
    shard = TenantKeys("acme").shard
    line = orjson.loads(store.redis.hget(shard.webhook_order, f"{endpoint['id']}/{A}"))
    assert line == [f"p|{endpoint['id']}/msg_{A}.5", f"{endpoint['id']}/msg_{A}.6"]
    assert store.redis.hlen(shard.webhook_deliveries) == 3  # 1 (in front), 5 and 6
    sent = []
    while (taken := take(store)[0]):
        sent += [t.message for t in taken]
        settle(store, taken[0], "delivered")
    assert sent == [f"msg_{A}.1", f"msg_{A}.5", f"msg_{A}.6"]


def test_a_rotation_never_brings_back_a_removed_endpoint(store: Store, tenant) -> None:
    tenant()
    endpoints = Endpoints(store)
    endpoint, _ = endpoints.add("acme", URL, ["job.completed"])
    read = store.redis.hget(TenantKeys("acme").webhooks, endpoint["id"])
    endpoints.remove("acme", endpoint["id"])
    assert endpoints._set("acme", {**endpoint, "secrets": []}, read=read) is False
    assert endpoints.all("acme") == [] and store.redis.hget(TenantKeys("acme").limits, "hooks") is None


def test_removing_an_endpoint_drops_every_delivery_it_had(store: Store, tenant) -> None:
    tenant()
    endpoints = Endpoints(store)
    endpoint, _ = endpoints.add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1), outbox_event(A, 2), outbox_event(B, 1))
    fan_out(store)
    [one, _], _, _ = take(store)
    endpoints.remove("acme", endpoint["id"])
    shard = TenantKeys("acme").shard
    assert (store.redis.hlen(shard.webhook_deliveries), store.redis.hlen(shard.webhook_order),
            store.redis.zcard(shard.webhook_ready), store.redis.exists(shard.webhook_due(endpoint["id"]))) == \
        (0, 0, 0, 0)
    assert settle(store, one, "delivered") is None  # the try in flight finds its delivery gone


@pytest.mark.parametrize("skew", [-60.0, 60.0])
def test_a_host_clock_a_minute_off_takes_what_redis_says_is_due(store: Store, tenant, skew: float) -> None:
    """Due times are Redis's clock: a process whose host clock is a minute behind (or ahead) takes a due
    delivery at once, and not one due a minute from now."""
    tenant()
    endpoint, _ = Endpoints(store).add("acme", URL, ["job.cancelled"])
    push(store, outbox_event(A, 1), outbox_event(B, 1))
    fan_out(store)
    shard = TenantKeys("acme").shard
    later = store.server_ms(shard) + 60_000  # B's delivery is due a minute from now
    store.redis.zadd(shard.webhook_due(endpoint["id"]), {f"{endpoint['id']}/{message_id(outbox_event(B, 1))}": later})
    deliveries = Deliveries(store, wall=lambda: time.time() + skew)
    took = deliveries.take(shard, lambda endpoint: (4, 0), most=10, lease_ms=120_000, window_ms=WINDOW_MS)
    assert [t.job for t in took.taken] == [A]
    assert took.earliest == later  # the next take: when B is due (A is leased for longer)


def test_a_take_gives_a_tenant_at_most_its_free_places_and_goes_on_to_the_next_tenants(store: Store) -> None:
    """Noisy's 3 endpoints are due first, 4 deliveries each: a take with room for 10 and a share of 2 a
    tenant leases 2 of noisy's (1 when it has one in flight already) and quiet's delivery, and names noisy
    as the tenant that waited."""
    endpoints, shard = Endpoints(store), TenantKeys("noisy").shard
    assert TenantKeys("quiet").shard == shard  # one shard here: both tenants in one take
    for n in range(3):
        endpoints.add("noisy", f"{URL}/{n}", ["job.cancelled"])
    store.redis.rpush(shard.webhook_outbox, *(orjson.dumps({**outbox_event(f"noisy.{i:020x}", 1), "tenant": "noisy"})
                                              for i in range(4)))
    fan_out(store)
    endpoints.add("quiet", URL, ["job.cancelled"])
    store.redis.rpush(shard.webhook_outbox, orjson.dumps({**outbox_event(B, 1), "tenant": "quiet"}))
    fan_out(store)
    deliveries = Deliveries(store)

    def take_with(tenants: dict[str, int]) -> Took:
        return deliveries.take(shard, lambda e: (4, 0), most=10, lease_ms=30_000, window_ms=WINDOW_MS,
                               tenants=tenants, share=2)

    took = take_with({})
    assert sorted(t.tenant for t in took.taken) == ["noisy", "noisy", "quiet"] and took.full == ["noisy"]
    took = take_with({"noisy": 1})
    assert [t.tenant for t in took.taken] == ["noisy"] and took.full == ["noisy"]
    took = take_with({"noisy": 0})
    assert took.taken == [] and took.full == ["noisy"]
    assert store.redis.hlen(shard.webhook_deliveries) == 3 * 4 + 1
