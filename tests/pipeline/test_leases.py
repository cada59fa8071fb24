"""The lease keeper: one thread per worker process renews every claim it holds, and sends refunds."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.errors import StaleLease
from pipeline.state.keys import JobKeys, ProviderKeys
from pipeline.state.store import Store
from pipeline.work.leases import FULL_S, Keeper
from tests.conftest import wait_until


def claimed(store: Store, admit, key: str, lease_ms: int):
    claim = store.claim(admit(key), worker="w", lease_ms=lease_ms, operation_id=f"op-{key}", servers={"sim": 10})
    assert claim is not None
    return claim


def expiry(store: Store, job_id: str) -> int:
    return int(store.redis.hget(JobKeys(job_id).record, "lease_expires"))


def test_one_thread_renews_every_held_lease_and_stops_with_the_last(store, admit) -> None:
    keeper = Keeper(store, lease_ms=600, refund=lambda n: None)
    first, second = claimed(store, admit, "a", 600), claimed(store, admit, "b", 600)
    before = expiry(store, first.job_id), expiry(store, second.job_id)
    with keeper.hold(first), keeper.hold(second):
        thread = keeper._thread
        # renewed (every 200 ms) well past the first expiry
        wait_until(lambda: min(expiry(store, first.job_id) - before[0], expiry(store, second.job_id) - before[1]) > 400,
                   timeout=10)
    assert thread is not None and keeper._thread in (None, thread)
    wait_until(lambda: keeper._thread is None and not thread.is_alive(), timeout=5)


def test_a_fenced_out_claim_is_lost_and_its_check_raises(store, admit) -> None:
    keeper = Keeper(store, lease_ms=300, refund=lambda n: None)
    claim = claimed(store, admit, "a", 300)
    with keeper.hold(claim) as held:
        held.check()  # still ours
        store.redis.hincrby(JobKeys(claim.job_id).record, "lease_gen", 1)  # someone else took it
        wait_until(held.lost.is_set, timeout=10)
        with pytest.raises(StaleLease):
            held.check()


def test_refunds_go_out_together_when_the_last_claim_ends(store, admit) -> None:
    sent: list[int] = []

    def refund(successes: int) -> None:
        sent.append(successes)
        store.budget("comfyui", "refund", successes, 100)

    store.budget("comfyui", "take", 10, 100)
    keeper = Keeper(store, lease_ms=60_000, refund=refund, flush_s=3600)  # the thread sends none for an hour
    first, second = claimed(store, admit, "a", 60_000), claimed(store, admit, "b", 60_000)
    with keeper.hold(first):
        with keeper.hold(second):
            keeper.refund()
        keeper.refund()
        keeper.refund()
        assert sent == []  # another claim still runs: left for the thread's next pass
    assert sent == [3]  # the last claim to end sent them, as one call
    assert store.redis.hget(ProviderKeys("comfyui").budget, "tokens") == "93"


def test_the_thread_sends_refunds_while_claims_run(store, admit) -> None:
    sent: list[int] = []
    keeper = Keeper(store, lease_ms=60_000, refund=sent.append, flush_s=0.05)
    with keeper.hold(claimed(store, admit, "a", 60_000)):
        keeper.refund()
        keeper.refund()
        wait_until(lambda: sum(sent) == 2, timeout=10)


def test_a_hanging_renewal_does_not_make_the_thread_spin(store, admit) -> None:
    """A renewal that hangs (its Redis stopped) runs in its own thread; the keeper's own thread sleeps."""
    release = threading.Event()

    class Hanging:
        def heartbeat(self, claim, *, lease_ms):
            release.wait(10)

    claim = claimed(store, admit, "a", 300)
    keeper = Keeper(Hanging(), lease_ms=300, refund=lambda n: None)  # due every 100 ms
    with keeper.hold(claim):
        time.sleep(0.3)  # the first renewal is under way, and hangs
        before = time.process_time()
        time.sleep(1.0)
        busy = time.process_time() - before
        release.set()
    assert busy < 0.3  # a spinning thread takes the whole second


def test_after_a_refund_finds_the_bucket_full_successes_send_none_for_a_while(store, admit) -> None:
    """A full bucket takes no more: for FULL_S after a refund that found it full, a process sends none."""
    sent: list[int] = []
    now = [1000.0]

    def refund(successes: int) -> bool:
        sent.append(successes)
        return True  # the bucket is full after it

    keeper = Keeper(store, lease_ms=60_000, refund=refund, flush_s=3600, clock=lambda: now[0])
    job = claimed(store, admit, "a", 60_000)
    with keeper.hold(job):
        keeper.refund()
    assert sent == [1]
    now[0] += FULL_S - 1
    with keeper.hold(job):
        keeper.refund()
        keeper.refund()
    assert sent == [1]  # within FULL_S: none sent
    now[0] += 2
    with keeper.hold(job):
        keeper.refund()
    assert sent == [1, 1]  # past it: refunded again
