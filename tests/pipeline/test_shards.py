"""The state split into shards: fleet stops hold in every shard, and a process given another
shard count than the state holds refuses to work."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import redis
from falcon import testing
from redis.cluster import RedisCluster

from api.app import create_app
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from pipeline.work.sweeper import Sweeper
from tests import cluster
from tests.api.conftest import job_body
from tests.faults.conftest import ROOT

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True


def test_a_stop_left_in_one_shard_reads_as_set_and_clears_everywhere(store: Store) -> None:
    last = keys.shards()[-1]  # a writer died after this shard, before the others
    store.redis.hset(last.fleet, "provider_credentials:a", 5)
    assert store.provider_block("a") == "provider_credentials"
    assert store.fleet({"a": 2})["a"]["stopped"] == {"provider_credentials": 5}
    assert store.block_provider("a", "provider_credentials", now_ms=9) is (keys.shard_count() > 1)
    assert store.clear_provider("a") is True
    assert [store.redis.hget(shard.fleet, "provider_credentials:a") for shard in keys.shards()] == \
        [None] * keys.shard_count()
    assert store.provider_block("a") is None and store.clear_provider("a") is False


def test_a_class_pause_shows_while_any_shard_has_it(store: Store) -> None:
    assert store.pause_class("batch", now_ms=7) is True and store.pause_class("batch") is False
    store.redis.hdel(keys.ShardKeys(0).fleet, "pause_class:batch")  # as a resume that died after shard 0
    assert store.class_pauses() == ({"batch": 7} if keys.shard_count() > 1 else {})
    assert store.resume_class("batch") is (keys.shard_count() > 1)
    assert store.class_pauses() == {}


def test_the_cli_and_the_worker_refuse_another_shard_count(store: Store, backend: str) -> None:
    if backend == "cluster":
        return  # the processes below reach the single server (RECKON_REDIS_URL); one run suffices
    store.check_shards()  # the deployment has one shard
    env = os.environ | {"RECKON_SHARDS": "4"}
    cli = subprocess.run([sys.executable, "-m", "pipeline.operate.cli", "tenant", "create", "gamma", "--allowance", "5"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert (cli.returncode, cli.stderr.strip()) == (1, "reckon: RECKON_SHARDS is 4 but this Redis holds 1 shards")
    assert store.tenants() == []  # nothing written, in any shard
    worker = subprocess.run([sys.executable, "-m", "pipeline.work.worker", "pipeline.work.actors", "--processes", "1"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert worker.returncode != 0 and "RECKON_SHARDS is 4 but this Redis holds 1 shards" in worker.stderr
    create_tenant(store.redis, "gamma", 5)  # the right count works
    assert store.tenants() == ["gamma"]


def test_a_primary_without_the_scripts_gets_them_again(store: Store) -> None:
    """As after a restart without persistence, or a resharding onto a new node."""
    create_tenant(store.redis, "acme", 100)
    shard = keys.TenantKeys("acme").shard
    node = store.redis.get_node_from_key(shard.wake).redis_connection if hasattr(store.redis, "get_node_from_key") \
        else store.redis

    def libraries() -> list[str]:
        return [dict(zip(entry[::2], entry[1::2], strict=True))["library_name"] for entry in node.function_list()]

    assert store.take_due(shard, limit=10, hold_ms=1000)[1] == [] and store.scripts.library in libraries()
    store.redis.function_flush()  # every primary
    assert libraries() == []
    assert store.take_due(shard, limit=10, hold_ms=1000)[1] == []  # not found: loaded again, run again
    assert libraries() == [store.scripts.library]


def test_each_shard_is_judged_by_the_clock_of_its_own_primary(redis_cluster: cluster.Cluster) -> None:
    """Leases are stamped by the clock of the primary that holds their shard (each script reads its
    own TIME); the sweeper must compare them with that clock, not with one node's for all shards:
    a primary whose host clock is a minute off would have every lease on it expire early or late.
    (libfaketime cannot run redis-server, so this checks where the time is asked.)"""
    client = redis_cluster.client()
    try:
        client.flushall()
        store = Store(client, shards=cluster.SHARDS)
        owners = Counter(client.get_node_from_key(shard.wake).port for shard in keys.shards())
        assert len(owners) >= 2  # the shards are spread over the primaries
        client.config_resetstat(target_nodes=RedisCluster.PRIMARIES)
        Sweeper(store, lambda *message: None, Settings()).sweep_once()
        times = {port: _calls(port, "time") for port in redis_cluster.ports}
        assert all(times[port] >= owners[port] for port in redis_cluster.ports)  # each shard asked its own
    finally:
        client.close()


def _calls(port: int, command: str) -> int:
    with redis.Redis(port=port) as node:
        return int(node.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_cluster_with_no_node_answering_is_a_503_not_a_500(tmp_path, settings) -> None:
    nodes = cluster.start(tmp_path)
    client = nodes.client()
    try:
        store = Store(client, shards=cluster.SHARDS)
        create_tenant(client, "acme", 1_000)
        headers = {"Authorization": f"Bearer {create_key(client, 'acme')}", "Idempotency-Key": "k1"}
        app = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, priority: None))
        nodes.stop()  # every primary gone at once
        answer = app.simulate_post("/v1/jobs", json=job_body(), headers=headers)
        assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
        assert answer.json["type"] == "urn:reckon:problem:state-unavailable"
    finally:
        client.close()
        nodes.stop()
