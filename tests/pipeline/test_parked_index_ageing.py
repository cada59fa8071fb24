"""The parked indexes (lua/_waiting.lua) keep each job's score in the parked set when the batch starvation bound
(lua/_slots.lua ``age_batch``) moves it ahead or sends it back: a claim counts a moved job once among the parked
jobs ahead of it, and a job sent back to its tag still counts ahead of a newcomer of a later tag; an entry of a
job cancelled while parked is not counted ahead of a claim (the count reads the parked set's own entries). The real
admission, claim, finish and unpark scripts on a real redis-server (bound 0: every parked batch job is past it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from tests.pipeline.test_capabilities import workflow
from tests.pipeline.test_parked_index import CAPS, Backlog

SHARD = keys.ShardKeys(0)
ANY = {"3": {"class_type": "KSampler", "inputs": {}}}


def _claim(store: Store, job_id: str, servers: dict[str, int], attempt: str) -> object:
    return store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"{job_id}-{attempt}", servers=servers)


def submitter(store: Store, settings: Settings) -> Callable[[str], str]:
    """Tenant acme's admissions of one-output jobs of ``priority``, each under a new intent."""
    create_tenant(store.redis, "acme", 10**9)
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    sent = iter(range(100))

    def submit(priority: str) -> str:
        body = {"kind": "image", "workflow": ANY, "outputs": 1, "priority": priority}
        return admitter.submit("acme", f"intent-{next(sent)}", body).job_id

    return submit


def test_a_moved_job_is_counted_once_ahead_of_a_claim(store: Store, settings: Settings) -> None:
    """gpu (cap 2) runs two interactive jobs; batch job m parks and is moved past the bound; both slots free; a
    later batch job k claims before the unpark: one job (m) is ahead of it for two free slots, so k takes one
    (before: m was counted from the index at its tag and again as moved, 2 ahead, and k parked), and the
    unpark calls m to the other."""
    servers = {"gpu": 2}
    submit = submitter(store, settings)
    running = [_claim(store, submit("interactive"), servers, "run") for _ in range(2)]
    assert all(claim is not None for claim in running)
    moved = submit("batch")
    assert _claim(store, moved, servers, "park") is None
    assert store.unpark(SHARD, servers, batch_wait_ms=0) == []  # both busy: m is moved, nobody called
    assert store.redis.zscore(SHARD.parked, moved) == store.redis.zscore(SHARD.parked_any, moved) < 0
    for claim in running:
        store.finish(claim, "cancelled", reason="cancelled")
    late = submit("batch")
    claim = _claim(store, late, servers, "run")
    assert claim is not None and claim.server == "gpu"
    assert store.unpark(SHARD, servers, batch_wait_ms=0) == [moved]


def test_a_job_sent_back_to_its_tag_still_counts_ahead_of_a_later_one(store: Store, settings: Settings) -> None:
    """x (sdxl on server a) is moved past the bound while a is busy and parks again moved (its index entry below
    0); a is paused, so x goes back to its tag; a resumes with its slot free; a later sdxl job claims before the
    unpark: x is ahead of it, so it parks (before: x's index entry stayed below 0, counted neither as moved nor
    at its tag, and the newcomer took x's slot) and the unpark calls x."""
    backlog = Backlog(store, dataclasses.replace(settings))
    on_a = backlog.claim(backlog.submit(workflow("sdxl.safetensors")))
    assert on_a.server == "a"
    x = backlog.submit(workflow("sdxl.safetensors"))
    assert backlog.claim(x) is None
    assert store.unpark(SHARD, CAPS, batch_wait_ms=0) == []  # b is free, but x cannot run there
    assert backlog.claim(x) is None  # parks again, moved
    assert store.redis.zscore(SHARD.parked, x) == store.redis.zscore(SHARD.parked_on("a"), x) < 0
    store.redis.hset(SHARD.fleet, "dispatch_paused:a", 1)
    assert store.unpark(SHARD, CAPS, batch_wait_ms=0) == []
    tag = store.redis.zscore(SHARD.parked, x)
    assert tag > keys.BATCH_RANK and store.redis.zscore(SHARD.parked_on("a"), x) == tag  # back to its tag
    store.redis.hdel(SHARD.fleet, "dispatch_paused:a")
    store.finish(on_a, "cancelled", reason="cancelled")
    assert backlog.claim(backlog.submit(workflow("sdxl.safetensors"))) is None  # x is ahead of it
    assert store.unpark(SHARD, CAPS, batch_wait_ms=0) == [x]


def test_a_cancelled_job_is_not_counted_ahead_of_a_claim(store: Store, settings: Settings) -> None:
    """gpu (cap 1) runs an interactive job; interactive j and batch l park; j is cancelled (its index entry
    stays until an unpark meets it); the slot frees; a later interactive job k claims before the unpark: no
    parked job ahead of it is left, so k takes the slot (before: j's entry was counted, k parked and waited for
    the unpark's call) and the unpark calls nobody."""
    servers = {"gpu": 1}
    submit = submitter(store, settings)
    running = _claim(store, submit("interactive"), servers, "run")
    assert running is not None
    cancelled, later = submit("interactive"), submit("batch")
    assert _claim(store, cancelled, servers, "park") is None and _claim(store, later, servers, "park") is None
    store.cancel(cancelled)
    assert store.redis.zrange(SHARD.parked, 0, -1) == [later]
    store.finish(running, "cancelled", reason="cancelled")
    claim = _claim(store, submit("interactive"), servers, "run")
    assert claim is not None and claim.server == "gpu"
    assert store.unpark(SHARD, servers, batch_wait_ms=3_600_000) == []
    assert store.redis.zrange(SHARD.parked_any, 0, -1) == [later]  # j's entry went with the claim's count


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_what_a_claim_behind_parked_jobs_costs(store: Store, settings: Settings, ahead: int) -> None:
    """Commands a claim runs (INFO commandstats, the script's own) when ``ahead`` parked jobs rank ahead of it on
    one server of ``ahead`` slots with one free: 12 whatever ``ahead`` (13 when the count was a ZCOUNT of the
    index beside a read of the moved band: the index's head and its jobs' places are read instead, and no more
    once the free slot is filled). It parks."""
    servers = {"gpu": ahead}
    submit = submitter(store, settings)
    for _ in range(ahead):
        assert _claim(store, submit("interactive"), servers, "run") is not None
    for _ in range(ahead):
        assert _claim(store, submit("batch"), servers, "park") is None
    store.redis.hincrby(SHARD.fleet, "busy:gpu", -1)  # a slot frees, its unpark not run yet
    late = submit("batch")
    store.redis.config_resetstat()
    assert _claim(store, late, servers, "run") is None
    stats = store.redis.info("commandstats")
    assert sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_config|resetstat")) == 12
