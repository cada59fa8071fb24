"""``reckon keys migrate`` on state written by the code before shards.

tests/fixtures/pre_shards_state.json holds every key (``DUMP``) of a Redis that code wrote
(tests/fixtures/pre_shards_gen.py, run on commit 0aa7b36): tenants acme and zeta, jobs completed
(with an output and its charge), running (submitted, leased), queued, cancelled, and zeta's queued
batch job; a server stop and an admission setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from falcon import testing

from api.app import create_app
from pipeline.state import keys
from pipeline.state.migrate import MigrationRefused, migrate
from pipeline.state.status import audit
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import list_keys

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "pre_shards_state.json").read_text())
JOBS = FIXTURE["jobs"]
BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}


def restore(client: Any) -> dict[str, str]:
    """Load the old state; returns acme's ledger as the old code left it."""
    for key, saved in FIXTURE["keys"].items():
        client.restore(key, saved["pttl"], bytes.fromhex(saved["dump"]))
    return client.hgetall("reckon:{t:acme}:ledger")


def test_one_shard_takes_every_key_over_as_it_was(store: Store, settings, make_executor, sim) -> None:
    ledger = restore(store.redis)
    lease = store.redis.zscore("reckon:{t:acme}:leases", JOBS["running"])
    assert migrate(store.redis, dry_run=True) == {"tenant_keys": 33, "shared_keys": 7, "expired": 0, "packed": 2}
    assert len(store.redis.keys("reckon:{t:*")) == 33  # a dry run changes nothing
    # the completed and the cancelled job are packed into one key each, once renamed
    assert migrate(store.redis) == {"tenant_keys": 33, "shared_keys": 7, "expired": 0, "packed": 2}
    assert store.redis.keys("reckon:{t:*") == [] and store.redis.exists("reckon:stats", "reckon:fleet") == 0
    assert store.redis.hgetall(keys.TenantKeys("acme").ledger) == ledger
    assert store.tenants() == ["acme", "zeta"] and len(list_keys(store.redis, "zeta")) == 1
    assert [store.job(JOBS[name])["state"] for name in ("done", "running", "queued", "cancelled", "zeta")] == \
        ["completed", "running", "queued", "cancelled", "queued"]
    assert store.redis.zscore(keys.TenantKeys("acme").leases, JOBS["running"]) == lease
    assert store.outputs(JOBS["done"])[0]["sha256"] == "a" * 64
    shard = keys.ShardKeys(0)
    assert store.redis.hget(shard.fleet, "busy:sim") == "1" and store.provider_block("other") == "dispatch_paused"
    assert store.redis.hget(shard.admission, "queue_cap:batch") == "500"
    assert audit(store.redis, store.tenants()) == []  # figures, ledger totals and indexes agree with the jobs

    replay = Admitter(store, lambda job_id, priority: None, settings).submit("acme", "queued", BODY)
    assert replay.job_id == JOBS["queued"]  # the idempotency record came along
    deadline = store.server_ms() + 3_600_000  # the fixture's own deadline passed an hour after it was made
    store.redis.hset(keys.JobKeys(JOBS["queued"]).record, "deadline", deadline)
    store.redis.zadd(keys.ShardKeys(0).due, {JOBS["queued"]: deadline})  # interactive: rank 0
    assert make_executor(sim).run(JOBS["queued"]) is True  # the new code runs an old job
    assert store.job(JOBS["queued"])["state"] == "completed" and audit(store.redis, store.tenants()) == []
    assert migrate(store.redis) == {"tenant_keys": 0, "shared_keys": 0, "expired": 0, "packed": 0}  # twice: nothing


def test_more_shards_wait_until_no_prompt_is_in_flight(store: Store) -> None:
    restore(store.redis)
    keys.use_shards(4)
    with pytest.raises(MigrationRefused, match="prompts are in flight"):
        migrate(store.redis)
    assert len(store.redis.keys("reckon:{t:*")) == 33  # nothing moved
    store.redis.hset("reckon:fleet", "busy:sim", 0)  # as once the running prompt ended and was settled
    migrate(store.redis)
    shards = {tenant: keys.TenantKeys(tenant).shard for tenant in ("acme", "zeta")}
    assert shards["acme"] != shards["zeta"]  # spread over two shards
    assert {tenant: store.redis.smembers(shard.tenants) for tenant, shard in shards.items()} == \
        {"acme": {"acme"}, "zeta": {"zeta"}}
    assert [store.redis.hget(shard.fleet, "dispatch_paused:other") is not None for shard in keys.shards()] == \
        [True] * 4
    assert store.redis.zrange(shards["zeta"].queue, 0, -1) == [JOBS["zeta"]]
    assert audit(store.redis, store.tenants()) == []
    assert store.redis.exists(*[f"reckon:{name}" for name in ("stats", "queue", "due", "wake", "fleet")]) == 0


class Interrupted:
    """The state client of a migration: the idempotency record ``gone`` expires as the renames
    start (after the SCAN found it), and the process dies after ``renames`` renames."""

    def __init__(self, client: Any, renames: int) -> None:
        self.client, self.left = client, renames

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def rename(self, old: str, new: str) -> Any:
        self.client.delete("reckon:{t:acme}:idem:gone")
        if not self.left:
            raise KeyboardInterrupt("the operator's shell went away")
        self.left -= 1
        return self.client.rename(old, new)


def test_an_interrupted_migration_is_finished_by_resuming_it(store: Store) -> None:
    ledger = restore(store.redis)
    store.redis.set("reckon:{t:acme}:idem:gone", "", ex=60)
    with pytest.raises(KeyboardInterrupt):
        migrate(Interrupted(store.redis, 10))
    left = len(store.redis.keys("reckon:{t:*"))
    renamed = len([key for key in store.redis.keys("reckon:{s0}:*") if key != keys.ShardKeys(0).meta])
    assert left + renamed == 33 and renamed in (9, 10)  # the expired record is gone, no other key lost
    with pytest.raises(MigrationRefused, match="--resume finishes a migration"):
        migrate(store.redis)
    assert migrate(store.redis, resume=True) == {"tenant_keys": left, "shared_keys": 7, "expired": 0, "packed": 2}
    assert store.redis.keys("reckon:{t:*") == [] and store.redis.hgetall(keys.TenantKeys("acme").ledger) == ledger
    assert audit(store.redis, store.tenants()) == []


def fixture(name: str) -> dict[str, Any]:
    return json.loads((Path(__file__).parent.parent / "fixtures" / name).read_text())


PER_KEY, ARCHIVED = fixture("per_key_state.json"), fixture("archived_state.json")
PACKED = ("completed", "retried", "cancelled_queued", "cancelled_running")


@pytest.mark.parametrize("saved", [PER_KEY, ARCHIVED], ids=["per_key", "archived"])
def test_finished_jobs_of_earlier_forms_are_packed_and_answer_as_they_did(store: Store, settings, saved) -> None:
    """Every key of a Redis that earlier code wrote (tests/fixtures/per_key_gen.py), with what its API
    answered for each job: completed (2 outputs, progress), completed on its second attempt, cancelled
    while queued, cancelled while running, failed (a dead letter), running. per_key_state.json: run on
    commit 7a4f958, before finished jobs were packed; archived_state.json: on commit 64c0583, which
    packed their parts as JSON in the record's field ``archive``."""
    for key, dumped in saved["keys"].items():
        store.redis.restore(key, dumped["pttl"], bytes.fromhex(dumped["dump"]))
    ids = saved["jobs"]
    assert migrate(store.redis, dry_run=True)["packed"] == 4
    assert migrate(store.redis) == {"tenant_keys": 0, "shared_keys": 0, "expired": 0, "packed": 4}
    assert migrate(store.redis)["packed"] == 0  # twice: nothing more
    for name, job_id in ids.items():
        j = keys.JobKeys(job_id)
        parts = [j.attempts, j.events, j.outputs, j.workflow, j.progress, j.progress_seen]
        live = {"failed": 3, "running": 5 if saved is PER_KEY else 4}  # progress marks became record fields
        assert store.redis.exists(*parts) == (0 if name in PACKED else live[name]), name
        if name in PACKED:
            assert sorted(store.redis.hkeys(j.record)) == ["state", "z"], name
    assert audit(store.redis, store.tenants()) == []
    api = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, priority: None))
    auth = {"Authorization": f"Bearer {saved['api_key']}"}
    for name, views in saved["views"].items():
        for path, before in views.items():
            now = api.simulate_get(f"/v1/jobs/{ids[name]}{path}" if name != "list" else "/v1/jobs", headers=auth)
            if path == "/events" and name in PACKED and saved is PER_KEY:  # a finished job keeps no progress
                kept = [e for e in orjson.loads(before)["events"] if e["type"] == "state"]
                assert orjson.loads(now.text) == {"events": kept}, name
            elif path == "" and name != "list":  # byte for byte, less what is planned live (unplanned here)
                view = orjson.loads(now.text)
                assert [view.pop(live, None) for live in ("queue", "eta")] == [None, None], (name, view)
                assert orjson.dumps(view).decode() == before, name
            else:
                assert now.text == before, (name, path)  # byte for byte


class DiesBeforePacking:
    """A client whose pack script call never happens: the migration dies right after putting a job
    back in its keys."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def fcall(self, *args: Any) -> Any:
        raise KeyboardInterrupt("the operator's shell went away")


def test_a_migration_that_dies_between_unpacking_and_packing_loses_nothing(store: Store, settings) -> None:
    for key, dumped in ARCHIVED["keys"].items():
        store.redis.restore(key, dumped["pttl"], bytes.fromhex(dumped["dump"]))
    job_id = ARCHIVED["jobs"]["completed"]
    with pytest.raises(KeyboardInterrupt):
        migrate(DiesBeforePacking(store.redis))
    j = keys.JobKeys(job_id)
    forms = [store.redis.hmget(keys.JobKeys(job).record, "state", "archive", "z") for job in ARCHIVED["jobs"].values()]
    finished = [(archived is not None, z is not None) for state, archived, z in forms if state in ("completed", "cancelled")]
    assert sorted(finished) == [(False, False), (True, False), (True, False), (True, False)]  # one put back in its keys
    assert migrate(store.redis)["packed"] == 4
    assert sorted(store.redis.hkeys(j.record)) == ["state", "z"] and store.redis.exists(j.outputs) == 0
    api = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, priority: None))
    auth = {"Authorization": f"Bearer {ARCHIVED['api_key']}"}
    for path, before in ARCHIVED["views"]["completed"].items():
        assert api.simulate_get(f"/v1/jobs/{job_id}{path}", headers=auth).text == before, path


class PurgesFirst:
    """A client on which the sweeper purges every listed job just before the migration puts the first
    one back in its keys (a sweeper left running beside it)."""

    def __init__(self, client: Any, store: Store, job_ids: list[str]) -> None:
        self.client, self.store, self.job_ids = client, store, job_ids

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def pipeline(self, transaction: bool = True, **kw: Any) -> Any:
        if transaction and self.job_ids:
            for job_id in self.job_ids:
                assert self.store.purge(job_id, retention_ms=0, now_ms=2**50)
            self.job_ids = []
        return self.client.pipeline(transaction=transaction, **kw)


def test_a_job_purged_while_the_migration_runs_leaves_no_key(store: Store) -> None:
    for key, dumped in ARCHIVED["keys"].items():
        store.redis.restore(key, dumped["pttl"], bytes.fromhex(dumped["dump"]))
    finished = [ARCHIVED["jobs"][name] for name in PACKED]
    assert migrate(PurgesFirst(store.redis, store, finished))["packed"] == 0
    for job_id in finished:
        assert store.redis.keys(keys.JobKeys(job_id).record + "*") == [], job_id
    assert audit(store.redis, store.tenants()) == []
