"""Inputs in Redis: what admission pays per input, deletion exact against admissions racing it, the
retention pass, the quota held atomically, and blob gc keeping every input's bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import InputInUse, InputUnknown
from pipeline.inputs import name_for
from pipeline.state import keys
from pipeline.state.inputs import RECHECK_MS, Input, InputStore
from pipeline.state.keys import TenantKeys
from pipeline.state.offers import Routes
from pipeline.state.scripts import Code
from pipeline.state.submit import Admitter
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper

DAY_MS = 86_400_000


def item(data: bytes) -> Input:
    sha = hashlib.sha256(data).hexdigest()
    return Input(name_for(sha, "image/png"), sha, len(data), "image/png")


def workflow(*names: str) -> dict[str, Any]:
    nodes: dict[str, Any] = {str(n): {"class_type": "LoadImage", "inputs": {"image": name}}
                             for n, name in enumerate(names, 1)}
    return nodes | {"9": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}


@pytest.fixture
def inputs(store) -> InputStore:
    return InputStore(store.redis, store.scripts)


@pytest.fixture
def submit(store, settings, broker, tenant):
    tenant()
    admitter = Admitter(store, Publisher(broker), settings)
    # offers read once: a re-read every 5 s (5 GETs) would land in a count on a slow machine
    admitter.routes = Routes(store.redis, [server.name for server in settings.servers()], ttl=float("inf"))
    return lambda key, *names: admitter.submit("acme", key, {"kind": "image", "workflow": workflow(*names),
                                                             "outputs": 1}).job_id


def commands_of(store, call) -> int:
    """Commands one call runs, its own and its scripts' (INFO commandstats counts those a script calls)."""
    store.redis.config_resetstat()
    call()
    stats = store.redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_config|resetstat"))


def test_admission_pays_two_commands_and_one_per_input_and_nothing_without_inputs(store, inputs, submit) -> None:
    """HMGET of the inputs and ZADD of their last use, once; SADD of the job to each input's set."""
    names = [inputs.put("acme", item(b"png %d" % n), default_quota=10**9)[0].name for n in range(3)]
    submit("k0")  # the first loads the scripts
    base = commands_of(store, lambda: submit("k1"))
    assert base == commands_of(store, lambda: submit("k5"))  # steady: the same for every job without inputs
    assert commands_of(store, lambda: submit("k2", names[0])) == base + 2 + 1
    assert commands_of(store, lambda: submit("k3", *names)) == base + 2 + 3
    assert commands_of(store, lambda: submit("k4", names[0], names[0])) == base + 2 + 1  # named twice: once


def test_a_delete_given_a_stale_read_of_the_jobs_reads_again_and_finds_the_new_job(store, inputs, submit) -> None:
    stored, _ = inputs.put("acme", item(b"png"), default_quota=10**9)
    t = TenantKeys("acme")
    job_id = submit("k1", stored.name)  # admitted after the caller read an empty set of jobs
    reply = store.scripts("input-delete", [t.inputs, t.shard.inputs_used, t.input_jobs(stored.sha256)],
                          ["acme", stored.sha256, 0, "", "", ""])
    assert Code(reply[0]) is Code.NOT_CLAIMABLE
    with pytest.raises(InputInUse) as busy:
        inputs.delete("acme", stored.sha256)
    assert busy.value.jobs == (job_id,)
    store.cancel(job_id)
    assert inputs.delete("acme", stored.sha256) == stored
    assert store.redis.exists(t.input_jobs(stored.sha256), t.shard.inputs_used) == 0
    assert store.redis.hgetall(t.inputs) == {"total": "0"}


def test_the_quota_is_checked_in_the_step_that_records_the_input(store, inputs, tenant) -> None:
    tenant()
    first, second = item(b"a" * 600), item(b"b" * 600)
    assert inputs.put("acme", first, default_quota=1000)[1] is True
    with pytest.raises(Exception) as over:  # the API's read said there was room: the step says there is not
        inputs.put("acme", second, default_quota=1000)
    assert (type(over.value).__name__, over.value.held, over.value.quota) == ("OverQuota", 600, 1000)
    assert inputs.put("acme", first, default_quota=1000) == (first, False)
    assert store.redis.hget(TenantKeys("acme").inputs, "total") == "600"


def test_an_input_unused_for_its_retention_goes_unless_an_unfinished_job_uses_it(store, inputs, submit) -> None:
    now = store.server_ms()
    idle, used = item(b"idle"), item(b"used")
    shard = TenantKeys("acme").shard
    inputs.put("acme", idle, default_quota=10**9, now_ms=now - 10)
    inputs.put("acme", used, default_quota=10**9, now_ms=now - 10)
    job_id = submit("k1", used.name)  # its last use: now, on Redis's clock
    assert inputs.expire(shard, retention_ms=DAY_MS, now_ms=now + DAY_MS - 11) == []
    assert inputs.expire(shard, retention_ms=DAY_MS, now_ms=now + DAY_MS - 10) == [f"acme/{idle.sha256}"]
    later = now + 2 * DAY_MS
    assert inputs.expire(shard, retention_ms=DAY_MS, now_ms=later) == []  # the queued job keeps it
    assert inputs.get("acme", used.sha256) == used
    assert store.redis.zscore(shard.inputs_used, f"acme/{used.sha256}") == later - DAY_MS + RECHECK_MS
    store.cancel(job_id)
    assert inputs.expire(shard, retention_ms=DAY_MS, now_ms=later + RECHECK_MS - 1) == []  # not looked at again yet
    assert inputs.expire(shard, retention_ms=DAY_MS, now_ms=later + RECHECK_MS) == [f"acme/{used.sha256}"]
    assert store.redis.hgetall(TenantKeys("acme").inputs) == {"total": "0"}


def test_the_sweeper_expires_inputs_once_a_minute_at_one_range_read_per_shard(store, settings, inputs, tenant) -> None:
    tenant()
    stored, _ = inputs.put("acme", item(b"old"), default_quota=10**9)
    aged = dataclasses.replace(settings, input_retention_seconds=60)
    sweeper = Sweeper(store, Publisher(actors.broker), aged, clock=lambda: time.time() + 61)
    assert sweeper.expire_inputs() == 1 and inputs.get("acme", stored.sha256) is None
    inputs.put("acme", item(b"new"), default_quota=10**9, now_ms=store.server_ms() - 120_000)
    assert commands_of(store, sweeper.expire_inputs) == 0  # within the minute: no command at all
    sweeper.inputs_ms -= 60_000
    assert commands_of(store, sweeper.expire_inputs) > 0 and store.redis.zcard(TenantKeys("acme").shard.inputs_used) == 0
    sweeper.inputs_ms -= 60_000
    # none due, none left: two ZRANGEBYSCORE a shard (the inputs due, and those named since the last pass)
    assert commands_of(store, sweeper.expire_inputs) == 2 * keys.shard_count()


def test_the_pass_prunes_finished_jobs_from_the_large_sets_of_inputs_in_use(store, inputs, submit) -> None:
    """An input named without pause is never due for expiry: its set is pruned of finished jobs all the same."""
    stored, _ = inputs.put("acme", item(b"busy"), default_quota=10**9)
    jobs = [submit(f"k{n}", stored.name) for n in range(5)]
    for job_id in jobs[:3]:
        store.cancel(job_id)
    shard, members = TenantKeys("acme").shard, TenantKeys("acme").input_jobs(stored.sha256)
    assert inputs.prune(shard, since_ms=0, above=5)[0] == 0 and store.redis.scard(members) == 5  # not above: left
    assert inputs.prune(shard, since_ms=0, above=4, sample=10)[0] == 3
    assert store.redis.smembers(members) == set(jobs[3:])
    with pytest.raises(InputInUse) as busy:
        inputs.delete("acme", stored.sha256)
    assert sorted(busy.value.jobs) == sorted(jobs[3:])


def test_blob_gc_keeps_every_inputs_bytes(store, inputs, settings, tenant) -> None:
    tenant()
    blobs = BlobStore(settings.blob_dir)
    kept, dropped = b"an input's bytes", b"bytes nothing names"
    stored, _ = inputs.put("acme", item(kept), default_quota=10**9)
    assert blobs.put(kept) == stored.sha256
    orphan = blobs.put(dropped)
    assert store.referenced_blobs() == {stored.sha256}
    assert blobs.collect(store.referenced_blobs(), min_age_s=0) == (1, 1)
    assert blobs.read(stored.sha256) == kept and not blobs.path(orphan).exists()


def test_a_replayed_job_holds_its_inputs_again_and_one_whose_input_is_gone_is_not_replayed(
        store, inputs, submit) -> None:
    """A failed job leaves its inputs' sets (it is finished); ``reckon dlq replay`` queues it again days later:
    it must hold each input again (a DELETE or the retention pass must wait for it), and a job whose input was
    deleted meanwhile must not be queued naming bytes that are gone."""
    kept, gone = item(b"kept"), item(b"gone")
    for each in (kept, gone):
        inputs.put("acme", each, default_quota=10**9)
    failed = {}
    for key, named in (("k1", [kept.name]), ("k2", [kept.name, gone.name])):
        job_id = submit(key, *named)
        claim = store.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{key}", servers={"s": 2})
        store.finish(claim, "failed", error_class="invalid_input", reason="invalid_input")
        failed[key] = job_id
    assert inputs.delete("acme", gone.sha256) == gone  # both jobs failed: nothing uses it
    queued = submit("k3", kept.name)
    with pytest.raises(InputInUse):  # which drops the failed jobs from the input's set
        inputs.delete("acme", kept.sha256)
    store.cancel(queued)
    store.replay(failed["k1"])
    assert store.job(failed["k1"])["state"] == "queued"
    with pytest.raises(InputInUse) as busy:  # the queued job keeps its input, as when it was admitted
        inputs.delete("acme", kept.sha256)
    assert busy.value.jobs == (failed["k1"],)
    used = store.redis.zscore(TenantKeys("acme").shard.inputs_used, f"acme/{kept.sha256}")
    assert used >= int(store.job(failed["k1"])["updated_at"])  # its retention counts from the replay
    with pytest.raises(InputUnknown):
        store.replay(failed["k2"])
    assert store.job(failed["k2"])["state"] == "failed"
    assert store.ledger("acme")["reserved"] == int(store.job(failed["k1"])["ceiling"])  # the refused one: nothing
    assert store.redis.smembers(TenantKeys("acme").input_jobs(kept.sha256)) == {failed["k1"]}


def test_the_pass_prunes_the_set_of_every_input_named_since_the_last_pass_not_only_the_last_ten(
        store, inputs, submit) -> None:
    """A set grows only when its input is named, and being named is its last use: a pass that looks at every
    input named since the last one sees every set that grew. Looking at the 10 named last only, the set of an
    input named a minute before ten others never shrank, however many of its jobs had ended."""
    since = store.server_ms()  # the last pass
    busy, _ = inputs.put("acme", item(b"busy"), default_quota=10**9)
    jobs = [submit(f"b{n}", busy.name) for n in range(6)]
    for job_id in jobs[:5]:
        store.cancel(job_id)
    for n in range(10):  # then ten other inputs named, each after it
        other, _ = inputs.put("acme", item(b"other %d" % n), default_quota=10**9)
        submit(f"o{n}", other.name)
    shard, members = TenantKeys("acme").shard, TenantKeys("acme").input_jobs(busy.sha256)
    removed, after = inputs.prune(shard, since_ms=since, above=4, sample=10)
    assert (removed, store.redis.smembers(members)) == (5, {jobs[5]})
    assert after >= int(store.job(jobs[5])["created_at"])  # the next pass starts where this one ended
    assert inputs.prune(shard, since_ms=after, above=0) == (0, after)  # nothing named since
