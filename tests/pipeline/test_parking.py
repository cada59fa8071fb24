"""Parked jobs and the slots they wait for: a newcomer never takes an older job's slot, a lost call
keeps its place, a freed slot publishes them; against real simulated servers and a real redis-server."""

from __future__ import annotations

import time

import dramatiq
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed
from pipeline.fleet import Server
from pipeline.providers import sim as simulated
from pipeline.providers.fleet import Fleet
from pipeline.state import keys
from pipeline.state.keys import JobKeys
from pipeline.state.store import CALL_MS
from pipeline.work import actors
from pipeline.work.executor import Executor
from pipeline.work.sweeper import Sweeper
from tests.conftest import wait_until
from tests.pipeline.test_fleet import in_order


def test_a_cancelled_job_leaves_the_parked_set(store, admit) -> None:
    caps = {"a": 1}
    running = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=caps)
    gone, waiting = admit("k1"), admit("k2")
    assert [store.claim(j, worker="w", lease_ms=60_000, operation_id=j, servers=caps) for j in (gone, waiting)] == [
        None, None]
    store.cancel(gone)
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [waiting]
    store.retry(running, delay_ms=60_000, error_class="test")
    assert store.unpark(keys.ShardKeys(0), caps) == [waiting]


def test_a_newcomer_does_not_take_the_slot_an_older_parked_job_waits_for(store, admit) -> None:
    caps = {"a": 1}
    first = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=caps)
    time.sleep(0.003)
    older = admit("k1")
    time.sleep(0.003)
    assert store.claim(older, worker="w", lease_ms=60_000, operation_id="op1", servers=caps) is None  # parked
    store.finish(first, "failed", error_class="test")  # a slot frees
    newer = admit("k2")
    time.sleep(0.003)
    assert store.claim(newer, worker="w", lease_ms=60_000, operation_id="op2", servers=caps) is None
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [older, newer]
    assert store.claim(older, worker="w", lease_ms=60_000, operation_id="op3", servers=caps).server == "a"
    batch = admit("k3", priority="batch")
    assert store.claim(batch, worker="w", lease_ms=60_000, operation_id="op4", servers=caps) is None
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [newer, batch]  # interactive first, then age


def test_a_call_whose_message_is_lost_keeps_its_place(store, admit) -> None:
    caps = {"a": 1}
    first = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=caps)
    older, younger = in_order(admit, "k1", "k2")
    for job_id in (older, younger):
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=caps) is None
    store.finish(first, "failed", error_class="test")
    now = store.server_ms()
    assert store.unpark(keys.ShardKeys(0), caps, now_ms=now) == [older]  # its message is lost
    assert store.claim(admit("k3"), worker="w", lease_ms=60_000, operation_id="k3", servers=caps) is None
    assert store.unpark(keys.ShardKeys(0), caps, now_ms=now + 1_000) == []  # the slot is still promised
    assert store.unpark(keys.ShardKeys(0), caps, now_ms=now + CALL_MS + 1) == [older]  # lapsed: called again, first
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1)[:2] == [older, younger]


def test_a_call_for_a_job_that_is_gone_or_cancelled_frees_its_promise(store, admit) -> None:
    caps = {"a": 1}
    first = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=caps)
    gone, cancelled, waiting = in_order(admit, "k1", "k2", "k3")
    for job_id in (gone, cancelled, waiting):
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=caps) is None
    store.finish(first, "failed", error_class="test")
    assert store.unpark(keys.ShardKeys(0), caps) == [gone]
    store.redis.delete(JobKeys(gone).record)  # purged meanwhile: its claim finds nothing
    assert store.claim(gone, worker="w", lease_ms=60_000, operation_id="x", servers=caps) is None
    assert store.unpark(keys.ShardKeys(0), caps) == [cancelled]
    store.cancel(cancelled)  # its call is void at once, not after CALL_MS
    assert store.unpark(keys.ShardKeys(0), caps) == [waiting]
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [waiting]


def test_parked_jobs_are_published_after_a_message_that_freed_a_slot_and_only_then(store, settings, admit) -> None:
    from pipeline.work.routing import Unpark

    executor = Executor(store, Fleet([Server("sim", "http://sim", 1)], lambda s: None), BlobStore(settings.blob_dir),
                        settings)
    published: list[tuple[str, str]] = []
    unpark = Unpark(lambda: executor, lambda job_id, route: published.append((job_id, route)))
    asked: list[str] = []
    calls = store.calls
    calls.unpark = lambda shard, servers, **kw: asked.append(shard.wake) or type(calls).unpark(calls, shard, servers, **kw)

    def after(job_id: str) -> None:
        unpark.after_process_message(actors.broker, dramatiq.Message(
            queue_name="q", actor_name="a", args=(job_id,), kwargs={}, options={}))

    first, waiting = admit("a"), admit("b")
    held = store.claim(first, worker="w", lease_ms=60_000, operation_id="op-a", servers={"sim": 1})
    assert held is not None
    assert store.claim(waiting, worker="w", lease_ms=60_000, operation_id="op-b", servers={"sim": 1}) is None
    after(waiting)  # parked, no slot freed
    assert published == [] and store.freed() is None
    store.retry(held, delay_ms=60_000, error_class="transient", free=True)  # gives the slot back
    after(first)
    assert published == [(waiting, "unparked")] and len(asked) == 1
    store.finish(store.claim(waiting, worker="w", lease_ms=60_000, operation_id="op-b2", servers={"sim": 1}),
                 "cancelled", reason="cancelled")  # frees the slot with nothing parked
    after(waiting)
    assert published == [(waiting, "unparked")] and len(asked) == 1  # asked only after the retry


def test_a_prompt_billed_while_the_collect_claim_was_under_way_is_never_taken_for_unrun(
        store, admit, make_executor) -> None:
    """A cancel's proof that a prompt never ran ("pending", then gone a moment after the delete, the epoch
    unchanged) rests on a read under the collect claim, not the read before it: here the prompt runs and
    is billed, and the server restarts (a stock ComfyUI: no epoch), while the claim is under way."""
    server = simulated.start(delay=0.5)
    try:
        blocker, job_id = admit(key="a"), admit(key="b")
        executor = make_executor(server, watch=True)
        executor.fleet["sim"].epoch = lambda: ""  # a stock ComfyUI shows no boot id
        assert executor.run(blocker) and executor.run(job_id)  # both at the watcher; job_id's prompt waits
        assert len(server.sim.queue()["queue_pending"]) == 1
        store.cancel(job_id)
        claim = store.collect_claim

        def slow_claim(*args, **kwargs):  # the claim's round trip is slow (an fsync stall, a failover)
            wait_until(lambda: len(server.sim.charges) == 2, timeout=10)  # job_id's prompt ran: billed
            server.sim.restart()  # then the server restarts: queue and history gone
            return claim(*args, **kwargs)

        store.collect_claim = slow_claim
        with pytest.raises(AttemptFailed) as failed:  # an unknown outcome: reconciliation's careful path
            executor.collect(job_id)
    finally:
        server.close()
    assert [c["units"] for c in server.sim.charges] == [10, 10]
    assert failed.value.cause.error_class == "unknown_outcome"
    job = store.job(job_id)
    assert job["state"] == "running" and job["settled"] == "0"  # not ended "removed" with nothing paid


def test_a_parked_job_is_not_sent_again_past_its_window_and_a_lost_one_still_is(
        store, settings, admit, make_executor, sim) -> None:
    """A job parked for a slot has no message to lose: the sweeper does not publish it again however long
    it waits (each copy only parked it again: a claim, a broker message, a fetch), and it is looked at
    again 32 windows later; a queued job whose message was lost (not parked) is sent again after one."""
    executor = make_executor(sim)
    full = [admit(f"busy-{i}") for i in range(2)]
    parked, lost = admit("parked"), admit("lost")
    store.redis.hset(keys.TenantKeys("acme").shard.fleet, "busy:sim", 1000)  # every slot taken
    assert not executor.run(parked)
    assert store.redis.zscore(keys.TenantKeys("acme").shard.parked, parked) is not None
    window, before = settings.outbox_grace_seconds, time.time()
    published = sweep_published(store, settings, ahead=window * 3)
    assert parked not in published and lost in published and set(full) <= set(published)
    queued = keys.TenantKeys("acme").queued
    looked = store.redis.zscore(queued, parked)  # when it is looked at again: 32 windows on
    assert looked >= (before + window * 3 + window * 31) * 1000 - 1  # the clock read in whole ms
    assert parked not in sweep_published(store, settings, ahead=window * 20)
    assert store.redis.zscore(queued, parked) == looked  # not yet due
    assert parked not in sweep_published(store, settings, ahead=window * 70)  # due, looked at, still parked
    assert store.redis.zscore(queued, parked) > looked
    assert store.job(parked).get("sends", "0") == "0"  # never sent again


def sweep_published(store, settings, *, ahead: float) -> list[str]:  # type: ignore[no-untyped-def]
    """The job ids one sweeper pass publishes, ``ahead`` seconds from now."""
    published: list[str] = []
    Sweeper(store, lambda job_id, route: published.append(job_id), settings,
            clock=lambda: time.time() + ahead).sweep_once()
    return published



def test_a_freed_server_calls_a_parked_job_while_another_servers_call_is_not_claimed_yet(store, admit) -> None:
    """The watcher's unpark names only the server whose prompt ended: a call promised to another server and
    not yet claimed holds that server's slot, not this one's (issue 33: the freed GPU idled until the
    sweeper's next pass, 0.3-1 s, in 5-7% of the gaps of a 16-server backlog)."""
    caps = {"a": 1, "b": 1}
    claims = [store.claim(admit(f"k{n}"), worker="w", lease_ms=60_000, operation_id=f"op{n}", servers=caps)
              for n in range(2)]
    on = {claim.server: claim for claim in claims}
    assert sorted(on) == ["a", "b"]
    first, second, third = in_order(admit, "k2", "k3", "k4")
    for job_id in (first, second, third):
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=caps) is None
    shard = keys.ShardKeys(0)
    assert store.slots.ended(on["b"]) == 3  # b's prompt ended: its watcher calls the best parked job to b
    assert store.unpark(shard, {"b": 1}) == [first]
    assert store.unpark(shard, {"b": 1}) == []  # b's one slot is promised: nobody else is called to it
    assert store.slots.ended(on["a"]) == 3  # a's prompt ended before the call to b was claimed
    assert store.unpark(shard, {"a": 1}) == [second]
    assert store.unpark(shard, caps) == []  # both slots promised
    taken = [store.claim(j, worker="w", lease_ms=60_000, operation_id=f"{j}-run", servers=caps)
             for j in (second, first)]
    assert [claim.server for claim in taken] == ["a", "b"]  # each on the server its call was promised
    assert store.claim(third, worker="w", lease_ms=60_000, operation_id="late", servers=caps) is None
    fleet = store.redis.hgetall(shard.fleet)
    assert (fleet["busy:a"], fleet["busy:b"]) == ("1", "1")
    assert store.redis.zrange(shard.parked, 0, -1) == [third]
