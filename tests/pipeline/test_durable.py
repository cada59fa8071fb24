"""Durable writes (WAIT after the script, on its connection) and how reckon names its Redis servers.

A private primary is started per test (tests/replication.py), so a replica can be attached or left
out without touching the session's redis-server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from falcon import testing
from redis.cluster import RedisCluster

from api.app import create_app
from pipeline.settings import Settings, with_db
from pipeline.state import redisconn
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import ReplicationTimeout, Scripts
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests.api.conftest import job_body
from tests.replication import RedisProcs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[RedisProcs]:
    group = RedisProcs(tmp_path)
    try:
        yield group
    finally:
        group.stop()


def durable_store(port: int, *, replicas: int, timeout_ms: int) -> Store:
    client = redisconn.connect_url(f"redis://127.0.0.1:{port}/0")
    return Store(client, Scripts(client, replicas=replicas, ack_timeout_ms=timeout_ms))


def test_sentinel_url_names_sentinels_master_and_database() -> None:
    target = redisconn.parse_sentinel_url("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380/orders/3")
    assert target == redisconn.SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "orders", 3, "s3cret")
    assert redisconn.parse_sentinel_url("redis+sentinel://h:1/m").db == 0
    for bad in ("redis+sentinel://h:1/", "redis+sentinel://h/m/0", "redis://h:1/m/0", "redis+sentinel://h:1/m/0/x"):
        with pytest.raises(ValueError):
            redisconn.parse_sentinel_url(bad)


def test_sentinel_settings_give_state_database_0_and_broker_database_1() -> None:
    settings = Settings.from_env({"RECKON_SENTINELS": "127.0.0.1:26379,127.0.0.1:26380",
                                  "RECKON_SENTINEL_MASTER": "orders", "RECKON_REPLICAS_TO_ACK": "1",
                                  "RECKON_ACK_TIMEOUT_MS": "250"})
    assert settings.redis_url == "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/orders/0"
    assert settings.broker_url == "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/orders/1"
    assert (settings.replicas_to_ack, settings.ack_timeout_ms) == (1, 250)
    assert with_db("redis+sentinel://h:1/m/0", 1) == "redis+sentinel://h:1/m/1"
    assert Settings.from_env({}).replicas_to_ack == 0  # single server: no WAIT


def durable_api(primary: int, *, timeout_ms: int) -> tuple[Store, testing.TestClient, dict[str, str]]:
    """The API on a store whose writes wait for one replica; tenant acme's headers for key k1."""
    store = durable_store(primary, replicas=1, timeout_ms=timeout_ms)
    create_tenant(store.redis, "acme", 1_000)
    app = testing.TestClient(create_app(Settings(), store=store, publish=lambda job_id, priority: None))
    return store, app, {"Authorization": f"Bearer {create_key(store.redis, 'acme')}", "Idempotency-Key": "k1"}


def test_a_durable_write_is_on_the_replica_when_it_returns(procs: RedisProcs) -> None:
    primary = procs.server()
    replica = procs.server(replica_of=primary)
    store, app, headers = durable_api(primary, timeout_ms=5000)
    result = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
    assert result.status_code == 202
    job_id = result.headers["location"].rsplit("/", 1)[1]
    assert procs.client(replica).hget(JobKeys(job_id).record, "state") == "queued"  # read at once, no wait


def test_wait_timeout_answers_503_and_the_same_key_replays_the_job_once_replicated(procs: RedisProcs) -> None:
    primary = procs.server()
    store = durable_store(primary, replicas=1, timeout_ms=300)  # no replica yet: every WAIT times out
    create_tenant(store.redis, "acme", 1_000)
    published: list[str] = []
    settings = dataclasses.replace(Settings(), replicas_to_ack=1, ack_timeout_ms=300)
    app = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, _: published.append(job_id)))
    headers = {"Authorization": f"Bearer {create_key(store.redis, 'acme')}", "Idempotency-Key": "k1"}

    first = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
    assert first.status_code == 503
    assert first.headers["content-type"] == "application/problem+json"
    assert first.headers["retry-after"] == "1"
    assert orjson.loads(first.content)["type"] == "urn:reckon:problem:replication-timeout"
    [job_id] = store.redis.zrange(TenantKeys("acme").jobs, 0, -1)  # written on the primary...
    assert store.job(job_id)["state"] == "queued"
    assert published == [job_id]  # ...and sent to the workers: if the primary lives, the job runs
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)  # the record in its window
    assert [r[:4] for w in windows if (r := store.redis.hget(w, "k1"))] == ["d202"]  # done, 202

    again = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
    assert again.status_code == 503  # a replay is acknowledged only once durable, too

    procs.server(replica_of=primary)
    for _ in range(3):  # as a client would, after Retry-After: on a busy machine a replica may ack late
        replayed = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
        if replayed.status_code != 503:
            break
    assert replayed.status_code == 202
    assert replayed.headers["idempotent-replayed"] == "true"
    assert replayed.headers["location"] == f"/v1/jobs/{job_id}"
    assert orjson.loads(replayed.content)["id"] == job_id
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1 and published == [job_id]


def test_a_refusal_under_a_wait_timeout_is_answered_as_the_refusal_it_is(procs: RedisProcs) -> None:
    primary = procs.server()
    store = durable_store(primary, replicas=1, timeout_ms=50)  # no replica: every WAIT times out
    create_tenant(store.redis, "acme", 5)
    settings = dataclasses.replace(Settings(), replicas_to_ack=1, ack_timeout_ms=50)
    app = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, _: None))
    headers = {"Authorization": f"Bearer {create_key(store.redis, 'acme')}", "Idempotency-Key": "k1"}
    refused = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
    assert refused.status_code == 402  # nothing was written but nothing is lost either: not a 503
    assert orjson.loads(refused.content)["type"] == "urn:reckon:problem:insufficient-allowance"
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0


def test_a_replay_waits_for_the_write_it_replays(procs: RedisProcs) -> None:
    primary = procs.server()
    replica = procs.server(replica_of=primary)
    _, app, headers = durable_api(primary, timeout_ms=2000)
    assert app.simulate_post("/v1/jobs", json=job_body(), headers=headers).status_code == 202
    procs.client(replica).replicaof("no", "one")  # the replica leaves: nothing confirms any more
    other = durable_store(primary, replicas=1, timeout_ms=100)  # another process, its own connections
    replay = testing.TestClient(create_app(Settings(), store=other, publish=lambda job_id, _: None))
    again = replay.simulate_post("/v1/jobs", json=job_body(), headers=headers)
    assert again.status_code == 503  # the replay's marker write has no replica to reach
    assert orjson.loads(again.content)["type"] == "urn:reckon:problem:replication-timeout"


def test_a_durable_write_that_times_out_has_happened_on_the_primary(procs: RedisProcs) -> None:
    primary = procs.server()
    store = durable_store(primary, replicas=1, timeout_ms=50)
    create_tenant(store.redis, "acme", 1_000)
    with pytest.raises(ReplicationTimeout) as raised:
        store.scripts("budget", ["reckon:test:budget"], ["take", 1, 10], durable=True)
    assert (raised.value.verb, raised.value.acked, raised.value.required) == ("budget", 0, 1)
    assert raised.value.reply == [0, 9]  # its reply: a token taken, 9 left
    assert store.redis.exists("reckon:test:budget") == 1  # the write stands; only its durability is unknown


def test_a_durable_call_loads_a_script_the_server_lost(procs: RedisProcs) -> None:
    primary = procs.server()
    procs.server(replica_of=primary)
    store = durable_store(primary, replicas=1, timeout_ms=5000)
    store.redis.function_flush()  # as on a server restarted empty
    assert store.scripts("budget", ["reckon:test:budget"], ["take", 1, 10], durable=True) == [0, 9]


def test_without_replicas_to_ack_nothing_waits(procs: RedisProcs) -> None:
    primary = procs.server()
    store = durable_store(primary, replicas=0, timeout_ms=50)
    assert store.scripts("budget", ["reckon:test:budget"], ["take", 1, 10], durable=True) == [0, 9]
    commands = store.redis.info("commandstats")
    assert "cmdstat_wait" not in commands and "cmdstat_set" not in commands


def test_the_state_client_is_a_sentinel_master_client_for_a_sentinel_url() -> None:
    client = redisconn.connect(Settings(redis_url="redis+sentinel://127.0.0.1:1,127.0.0.1:2/orders/4"))
    pool = client.connection_pool
    assert (pool.service_name, pool.is_master) == ("orders", True)
    assert pool.connection_kwargs["db"] == 4 and pool.connection_kwargs["socket_timeout"] == 10.0
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in pool.sentinel_manager.sentinels] == [("127.0.0.1", 1), ("127.0.0.1", 2)]


def test_on_a_cluster_the_script_and_its_wait_go_to_the_node_that_holds_the_keys(redis_cluster) -> None:
    client = redis_cluster.client()
    try:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
        scripts = Scripts(client, replicas=1, ack_timeout_ms=20)  # the test cluster has no replicas
        key = "reckon:{s1}:test:budget"
        owner = client.get_node_from_key(key).port
        with pytest.raises(ReplicationTimeout):  # the node lacks the script: loaded there, run once
            scripts("budget", [key], ["take", 1, 10], durable=True)
        assert client.hget(key, "tokens") == "9"
        waits = {port: _waits(port) for port in redis_cluster.ports}
        with pytest.raises(ReplicationTimeout):
            scripts("budget", [key], ["take", 1, 10], durable=True)
        assert client.hget(key, "tokens") == "8"
        assert {port: _waits(port) - before for port, before in waits.items()} == {
            port: int(port == owner) for port in redis_cluster.ports}
    finally:
        client.close()


def _waits(port: int) -> int:
    node = RedisProcs.client(port)
    try:
        return int(node.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        node.close()


def test_an_ack_timeout_that_the_socket_timeout_could_cut_is_refused() -> None:
    assert Settings.from_env({"RECKON_ACK_TIMEOUT_MS": "5000"}).ack_timeout_ms == 5000
    for bad in ("0", "5001", "20000"):
        with pytest.raises(ValueError, match="RECKON_ACK_TIMEOUT_MS must be between 1 and 5000"):
            Settings.from_env({"RECKON_ACK_TIMEOUT_MS": bad})


def test_on_a_cluster_a_script_goes_straight_to_the_node_of_its_keys(redis_cluster) -> None:
    """redis-py would ask a node where an FCALL's keys are (COMMAND GETKEYS) before every call."""
    client = redis_cluster.client()
    try:
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
        scripts = Scripts(client)
        key = "reckon:{s2}:test:budget"
        owner = client.get_node_from_key(key).port

        def calls(command: str) -> dict[int, int]:
            stats = {port: RedisProcs.client(port).info("commandstats") for port in redis_cluster.ports}
            return {port: int(s.get(f"cmdstat_{command}", {}).get("calls", 0)) for port, s in stats.items()}

        scripts("budget", [key], ["take", 1, 10])  # loads the library where it is missing
        getkeys, fcalls = calls("command|getkeys"), calls("fcall")
        for _ in range(5):
            scripts("budget", [key], ["take", 1, 10])
        assert client.hget(key, "tokens") == "4"
        assert calls("command|getkeys") == getkeys
        assert {port: n - fcalls[port] for port, n in calls("fcall").items()} == {
            port: 5 * (port == owner) for port in redis_cluster.ports}
    finally:
        client.close()


def test_a_slot_freed_by_an_unconfirmed_finish_still_publishes_the_parked_job(procs: RedisProcs, settings) -> None:
    import os
    import signal

    import dramatiq

    from pipeline.blobs.local import BlobStore
    from pipeline.fleet import Server
    from pipeline.providers.fleet import Fleet
    from pipeline.state.submit import Admitter
    from pipeline.work import actors
    from pipeline.work.executor import Executor
    from pipeline.work.routing import Unpark

    primary = procs.server()
    replica = procs.server(replica_of=primary)
    store = durable_store(primary, replicas=1, timeout_ms=300)
    create_tenant(store.redis, "acme", 10_000)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    first, waiting = (admitter.submit("acme", key, {"kind": "image", "workflow": {"1": {}}, "outputs": 1}).job_id
                      for key in ("a", "b"))
    held = store.claim(first, worker="w", lease_ms=60_000, operation_id="op-a", servers={"sim": 1})
    assert store.claim(waiting, worker="w", lease_ms=60_000, operation_id="op-b", servers={"sim": 1}) is None
    executor = Executor(store, Fleet([Server("sim", "http://sim", 1)], lambda s: None), BlobStore(settings.blob_dir),
                        settings)
    published: list[str] = []
    unpark = Unpark(lambda: executor, lambda job_id, route: published.append(job_id))
    os.kill(procs.procs[replica].pid, signal.SIGSTOP)  # the replica lags: WAIT times out
    try:
        with pytest.raises(ReplicationTimeout):
            store.finish(held, "cancelled", reason="cancelled")  # the write stands on the primary
    finally:
        os.kill(procs.procs[replica].pid, signal.SIGCONT)
    unpark.after_process_message(actors.broker, dramatiq.Message(queue_name="q", actor_name="a", args=(first,),
                                                                 kwargs={}, options={}))
    assert published == [waiting]


def test_unpark_runs_after_the_failure_routing() -> None:
    """Dramatiq runs after-message hooks in reverse order of the middleware list: Unpark must come
    before FailureRouter there, so it sees the slot the routing's retry or dead letter gave back."""
    from pipeline.work import actors
    from pipeline.work.routing import FailureRouter, Unpark

    kinds = [type(m) for m in actors.broker.middleware]
    assert kinds.index(Unpark) < kinds.index(FailureRouter)
