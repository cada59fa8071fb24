"""Dispatch among servers that differ, under attack (a review's reproductions, kept as regression tests):
a backlog only one server can run, promised slots, parked entries of jobs that ended, the watcher's
unpark, a paused class, and the admission of a workflow no server can run. Real scripts, real redis-server."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.errors import UnsupportedWorkflow
from pipeline.settings import Settings
from pipeline.state import keys, offers
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from tests.pipeline.test_capabilities import FLUX, NODES, SDXL, body, offer, workflow

CAPS = {"a": 1, "b": 1}
SHARD = keys.ShardKeys(0)


@pytest.fixture
def fleet_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, providers="a=http://127.0.0.1:9;cap=1;price=30,b=http://127.0.0.1:9;cap=1;price=10")


def claim(store: Store, job_id: str, op: str = ""):
    return store.claim(job_id, worker="w", lease_ms=60_000, operation_id=op or f"op-{job_id}", servers=CAPS)


def test_server_b_is_used_while_more_than_32_jobs_only_a_can_run_are_parked_ahead(store: Store, fleet_settings: Settings) -> None:
    """One server's backlog does not hold another server's free slot: with 33 jobs only `a` can run parked
    ahead (beyond unpark's first look of open + calls + 32), a job `b` can run takes b's free slot, as its
    claim counts only the parked jobs that could use its servers' free slots (tests/pipeline/test_parked_index.py
    for a backlog of 2,100)."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    running = claim(store, admitter.submit("acme", "s", body(workflow("sdxl.safetensors"))).job_id)
    assert running.server == "a"
    for n in range(33):  # a's backlog
        assert claim(store, admitter.submit("acme", f"s{n}", body(workflow("sdxl.safetensors"))).job_id) is None
    flux = admitter.submit("acme", "f", body(workflow("flux.safetensors"))).job_id
    assert claim(store, flux).server == "b"  # b is free, and none of the 33 ranked ahead can run there
    assert [job for _ in range(5) for job in store.unpark(SHARD, CAPS)] == []  # five sweeper passes: a is full


def test_a_called_job_keeps_its_promised_slot_whoever_claims_first(store: Store, fleet_settings: Settings) -> None:
    """Unpark calls J1 (only `a` can run it) for a's slot and J2 (any server) for b's, each promised its server
    (`c:<job id>`); J2 claims first and takes b, though a is warm with its checkpoint; J1 then takes a."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, {"checkpoints": ["sdxl.safetensors", "flux.safetensors"]}), 1)
    offers.write(store.redis, "b", offer(NODES, {"checkpoints": ["flux.safetensors", "other.safetensors"]}), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    submit = lambda key, ckpt: admitter.submit("acme", key, body(workflow(ckpt))).job_id  # noqa: E731
    y = claim(store, submit("y", "other.safetensors"))  # b only
    x = claim(store, submit("x", "flux.safetensors"))  # any: the free one, a (a now warm with flux)
    assert (y.server, x.server) == ("b", "a")
    j1, j2 = submit("j1", "sdxl.safetensors"), submit("j2", "flux.safetensors")
    assert store.job(j1)["servers"] == "a" and "servers" not in store.job(j2)
    assert claim(store, j1) is None and claim(store, j2) is None
    store.finish(x, "cancelled", reason="cancelled")
    store.finish(y, "cancelled", reason="cancelled")
    assert store.unpark(SHARD, CAPS) == [j1, j2]  # j1 for a, j2 for b
    second = claim(store, j2)  # messages of the unparked queue race between workers
    assert second is not None
    first = claim(store, j1)
    assert (second.server, first.server) == ("b", "a")


def test_a_parked_job_past_its_deadline_leaves_the_parked_set_with_its_fields(
        store: Store, fleet_settings: Settings) -> None:
    """The sweeper's redelivery fails a parked job past its deadline; it leaves the parked and called sets
    and its `p:` field goes with it (a claim would find no record to clean by, once it is purged)."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    running = claim(store, admitter.submit("acme", "s0", body(workflow("sdxl.safetensors"))).job_id)
    parked = admitter.submit("acme", "s1", body(workflow("sdxl.safetensors"), deadline_s=30)).job_id
    assert claim(store, parked) is None
    assert store.redis.hget(SHARD.fleet, f"p:{parked}") is not None
    later = int(store.job(parked)["deadline"]) + 1
    assert store.redeliver(parked, "queued", window_ms=1, now_ms=later) is None  # failed: deadline_exceeded
    assert store.job(parked)["state"] == "failed"
    assert store.redis.zscore(SHARD.parked, parked) is None
    assert store.redis.hget(SHARD.fleet, f"p:{parked}") is None
    assert store.purge(parked, retention_ms=0, now_ms=later + 1)
    store.finish(running, "cancelled", reason="cancelled")
    assert store.unpark(SHARD, CAPS) == []  # nothing stale is called


def test_the_watchers_unpark_ages_batch_jobs_at_the_configured_bound(
        store: Store, settings: Settings) -> None:
    """The bound is RECKON_BATCH_MAX_WAIT_SECONDS for the watcher's unpark too (after a probe finds its server
    back): with the bound at 3600 s, a batch job queued 700 s ago is not moved ahead of interactive ones."""
    from pipeline.state.progress import record
    from pipeline.work.watcher import ServerWatch
    from tests.pipeline.conftest import single
    from tests.pipeline.test_watcher import Clock, Rendering

    settings = dataclasses.replace(settings, batch_max_wait_seconds=3600)
    create_tenant(store.redis, "acme", 10**8)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    graph = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}
    caps = {"sim": 1}
    take = lambda job_id: store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=caps)  # noqa: E731
    assert take(admitter.submit("acme", "x", {"kind": "image", "workflow": graph, "outputs": 1}).job_id)
    old = admitter.submit("acme", "b", {"kind": "image", "workflow": graph, "outputs": 1, "priority": "batch"}).job_id
    assert take(old) is None
    now = int(store.redis.time()[0]) * 1000
    store.redis.zadd(SHARD.queue, {old: keys.BATCH_RANK + now - 700_000})  # queued 700 s ago (< 3600 s)
    store.block_provider("sim", "provider_unreachable")
    watch = ServerWatch("sim", single(Rendering(), cap=1), store, lambda job, why: None, settings,
                        lambda *point: record(store.scripts, *point), Clock())
    watch._probe(2000.0)  # the server answers again: dispatch resumes, the watcher unparks
    assert store.redis.zscore(SHARD.parked, old) >= keys.BATCH_RANK  # not moved: 700 s is within 3600 s


def test_jobs_of_a_removed_server_leave_the_parked_set_when_their_deadline_fails_them(
        store: Store, fleet_settings: Settings) -> None:
    """docs/fleet.md: a job whose servers were all removed from RECKON_PROVIDERS waits parked until its
    deadline fails it; then its entry and its `p:` field go, and no later claim counts it ahead."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    only_b = {"b": 1}  # the operator removed a from RECKON_PROVIDERS; workers and sweeper restarted
    gone = [admitter.submit("acme", f"s{n}", body(workflow("sdxl.safetensors"), deadline_s=30)).job_id
            for n in range(33)]
    for job_id in gone:
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=only_b) is None
    assert store.unpark(SHARD, only_b) == []  # none of their servers is configured: never called
    later = max(int(store.job(j)["deadline"]) for j in gone) + 1
    for job_id in gone:  # the sweeper fails them past their deadline
        assert store.redeliver(job_id, "queued", window_ms=1, now_ms=later) is None
        assert store.job(job_id)["state"] == "failed"
    assert store.redis.zcard(SHARD.parked) == 0
    assert [f for f in store.redis.hkeys(SHARD.fleet) if f.startswith(("p:", "c:"))] == []
    flux = admitter.submit("acme", "f", body(workflow("flux.safetensors"))).job_id
    assert store.claim(flux, worker="w", lease_ms=60_000, operation_id=flux, servers=only_b).server == "b"


def test_while_batch_is_paused_a_moved_batch_job_does_not_make_interactive_newcomers_park(
        store: Store, settings: Settings) -> None:
    """A batch job moved past the bound keeps its negative score when batch is then paused; an interactive claim
    does not count it ahead (unpark would not call it while batch is paused): with a free slot, it runs."""
    create_tenant(store.redis, "acme", 10**8)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    graph = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}
    submit = lambda key, prio: admitter.submit(  # noqa: E731
        "acme", key, {"kind": "image", "workflow": graph, "outputs": 1, "priority": prio}).job_id
    caps = {"sim": 1}
    take = lambda job_id: store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=caps)  # noqa: E731
    running = take(submit("x", "interactive"))
    old = submit("b", "batch")
    assert take(old) is None
    store.unpark(SHARD, caps, batch_wait_ms=0)  # past the bound: moved up
    assert store.redis.zscore(SHARD.parked, old) < 0
    store.pause_class("batch")
    store.finish(running, "cancelled", reason="cancelled")  # a free slot; only a paused batch job is parked
    assert take(submit("i", "interactive")) is not None


def test_the_refusal_of_an_unsupported_workflow_is_decided_in_the_admission_script(
        store: Store, fleet_settings: Settings) -> None:
    """A retry of an admitted request replays; anything else is refused. Both are decided by the admission
    script itself, after its idempotency read: no separate check can see a record that lapses before the
    script runs (which admitted such a workflow for every server once)."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, SDXL), 1)
    offers.write(store.redis, "b", offer(NODES, FLUX), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    before = sorted(store.redis.keys("*"))
    with pytest.raises(UnsupportedWorkflow):
        admitter.submit("acme", "k", body(workflow("sd15.safetensors", "Magic")))
    assert sorted(store.redis.keys("*")) == before
    admitted = admitter.submit("acme", "k2", body(workflow("sdxl.safetensors"))).job_id
    offers.write(store.redis, "a", offer([], {}), 2)  # no server can run it now
    admitter.routes.ttl = 0
    replay = admitter.submit("acme", "k2", body(workflow("sdxl.safetensors")))
    assert (replay.job_id, replay.replayed) == (admitted, True)
    for window in keys.TenantKeys("acme").idempotency_windows(None, 24 * 3600)[0]:
        store.redis.hdel(window, "k2")  # the record lapsed: a new request now
    with pytest.raises(UnsupportedWorkflow):
        admitter.submit("acme", "k2", body(workflow("sdxl.safetensors")))


def test_a_newcomer_leaves_the_slot_promised_to_a_called_restricted_job(store: Store, fleet_settings: Settings) -> None:
    """a's and b's slots are free and J1 (only a can run it) is called for a's: a newcomer any server can run
    takes b, though a is warm with its checkpoint, and J1 then takes a."""
    create_tenant(store.redis, "acme", 10**8)
    offers.write(store.redis, "a", offer(NODES, {"checkpoints": ["sdxl.safetensors", "flux.safetensors"]}), 1)
    offers.write(store.redis, "b", offer(NODES, {"checkpoints": ["flux.safetensors", "other.safetensors"]}), 1)
    admitter = Admitter(store, lambda job_id, priority: None, fleet_settings)
    submit = lambda key, ckpt: admitter.submit("acme", key, body(workflow(ckpt))).job_id  # noqa: E731
    y = claim(store, submit("y", "other.safetensors"))
    x = claim(store, submit("x", "flux.safetensors"))
    assert (y.server, x.server) == ("b", "a")
    j1 = submit("j1", "sdxl.safetensors")
    assert claim(store, j1) is None
    store.finish(x, "cancelled", reason="cancelled")
    store.finish(y, "cancelled", reason="cancelled")
    assert store.unpark(SHARD, CAPS) == [j1]
    newcomer = claim(store, submit("n", "flux.safetensors"))
    assert newcomer is not None and newcomer.server == "b"  # a's slot is promised to j1
    assert claim(store, j1).server == "a"
