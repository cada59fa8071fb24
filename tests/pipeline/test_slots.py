"""A server's cap across shards (pipeline/state/slots.py) on a real redis-server with two shards:
each step that takes, keeps or gives back a slot, and each crash window between a slot and a claim."""

from __future__ import annotations

from typing import Iterator

import pytest

from pipeline.errors import DispatchPaused
from pipeline.fleet import Server
from pipeline.providers.base import OperationStatus
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state import keys, slots
from pipeline.state.progress import record
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.watcher import ServerWatch
from tests.pipeline.conftest import WORKFLOW

CAPS = {"a": 1, "b": 2}


@pytest.fixture
def two(redis_client) -> Iterator[Store]:
    store = Store(redis_client, shards=2)
    yield store
    keys.use_shards(1)


def admit(store: Store, key: str) -> str:
    from pipeline.settings import Settings
    from pipeline.state.submit import Admitter

    if not store.redis.exists(keys.TenantKeys("acme").ledger):
        create_tenant(store.redis, "acme", 10**6)
    admitter = Admitter(store, lambda job_id, priority: None, Settings.from_env())
    return admitter.submit("acme", key, {"kind": "image", "workflow": WORKFLOW, "outputs": 1}).job_id


def claim(store: Store, job_id: str):
    return store.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{job_id}", servers=CAPS)


def held(store: Store) -> dict[str, list[str]]:
    """Server -> the jobs whose attempts hold its slots (members are ``<job id>/<operation id>``)."""
    return {name: [m.partition("/")[0] for m in store.redis.zrange(keys.server_slots(name), 0, -1)] for name in CAPS}


def test_claims_take_a_server_slot_and_a_full_fleet_parks(two: Store) -> None:
    jobs = [admit(two, f"k{n}") for n in range(4)]
    claims = [claim(two, job_id) for job_id in jobs]
    assert [c is not None for c in claims] == [True, True, True, False]
    assert sorted(sum(held(two).values(), [])) == sorted(jobs[:3])
    assert {name: len(ids) for name, ids in held(two).items()} == {"a": 1, "b": 2}
    assert two.redis.zrange(keys.JobKeys(jobs[3]).shard.parked, 0, -1) == [jobs[3]]
    two.finish(claims[0], "cancelled", reason="cancelled")  # gives back both counts
    assert claims[0].job_id not in sum(held(two).values(), [])


def test_a_duplicate_message_of_a_running_job_leaves_its_slot(two: Store) -> None:
    job_id = admit(two, "k1")
    first = claim(two, job_id)
    assert claim(two, job_id) is None  # the message again: not queued, no slot taken or given
    assert held(two)[first.server] == [job_id]


def test_a_slot_taken_for_a_claim_that_never_came_is_freed_after_the_grace(two: Store, monkeypatch) -> None:
    job_id = admit(two, "k1")
    assert two.slots.take("a", 1, f"{job_id}/op-lost") == 1  # the worker died here (after_slot_taken)
    assert two.slots.keep(CAPS) == 0 and held(two)["a"] == [job_id]  # within the grace: it may still claim
    monkeypatch.setattr(slots, "GRACE_MS", 0)
    assert two.slots.keep(CAPS) == 1 and held(two)["a"] == []
    running = claim(two, job_id)  # the message again: the job runs, with a slot of its own
    assert running is not None and held(two)[running.server] == [job_id]
    assert two.slots.keep(CAPS) == 0 and held(two)[running.server] == [job_id]  # held: renewed, not freed


def test_a_claim_whose_slot_was_freed_meanwhile_sends_nothing(two: Store, monkeypatch) -> None:
    job_id = admit(two, "k1")
    running = claim(two, job_id)
    two.slots.give(running.server, running)  # as the sweeper would for a claim later than the grace
    with pytest.raises(DispatchPaused):
        two.mark_submit(running, epoch="", lease_ms=60_000)
    assert two.job(job_id)["submitted"] == "0"


def test_unpark_calls_no_more_than_the_slots_free_across_shards(two: Store) -> None:
    other = "zeta"  # a tenant in the other shard holds both of b's slots and a's
    create_tenant(two.redis, other, 10**6)
    assert keys.TenantKeys(other).shard != keys.TenantKeys("acme").shard
    for n, name in enumerate(["a", "b", "b"]):
        assert two.slots.take(name, CAPS[name], f"{other}.{n:020d}") == 1
    parked = [admit(two, f"k{n}") for n in range(2)]
    assert [claim(two, job_id) for job_id in parked] == [None, None]
    shard = keys.TenantKeys("acme").shard
    assert two.unpark(shard, CAPS) == []  # its own shard's counts say 3 free; there are none
    two.redis.zrem(keys.server_slots("b"), f"{other}.{1:020d}")
    assert two.unpark(shard, CAPS) == parked[:1]


def take_script(store: Store, server: str):  # type: ignore[no-untyped-def]
    """slot-take on ``server``: an attempt's take (``call_ms`` None) or a call's reservation for shard 0."""
    key = [keys.server_slots(server), keys.server_waiting(server)]
    return lambda member, call_ms=None: store.scripts(
        "slot-take", key, [1, member, "" if call_ms is None else 0, "", "" if call_ms is None else call_ms])


def test_a_slot_is_never_freed_by_its_age_alone(two: Store) -> None:
    key, take = keys.server_slots("a"), take_script(two, "a")
    assert take("acme.gone/op") == [0, 1]
    assert take("acme.gone/op") == [0, 2]  # held: renewed, one slot
    assert take("acme.next/op") == [0, 0]  # full
    two.redis.zadd(key, {"acme.gone/op": 1})  # taken or renewed long ago: only the sweeper, reading, frees it
    assert take("acme.next/op") == [0, 0]
    assert take("acme.next/call", 10_000) == [0, 0]  # nor does a call's reservation take it
    assert two.redis.zrange(key, 0, -1) == ["acme.gone/op"]


def test_a_lapsed_call_reservation_frees_its_slot_and_only_it(two: Store) -> None:
    """A call's reservation is a promise that lapses (scored by when); an attempt's slot never does."""
    key, take = keys.server_slots("a"), take_script(two, "a")
    assert take("acme.called/call", 10_000) == [0, 1]
    assert take("acme.next/op") == [0, 0]  # reserved: full
    assert two.redis.zrangebyscore(key, two.server_ms() + 5_000, "+inf") == ["acme.called/call"]  # lapses later
    two.redis.zadd(key, {"acme.called/call": 1})  # its call lapsed long ago, never taken over
    assert take("acme.next/op") == [0, 1]
    assert two.redis.zrange(key, 0, -1) == ["acme.next/op"]
    # the sweeper's keep, too, frees a lapsed reservation (no record holds it) and leaves a live one
    gone, kept = admit(two, "gone"), admit(two, "kept")  # queued, named by no attempt
    assert take_script(two, "b")(f"{kept}/call", 10_000) == [0, 1]
    two.redis.zadd(keys.server_slots("b"), {f"{gone}/call": 1})
    assert two.slots.keep({"b": 2}) == 1
    assert two.redis.zrange(keys.server_slots("b"), 0, -1) == [f"{kept}/call"]


def test_a_stopped_server_is_not_tried_and_the_job_takes_another(two: Store) -> None:
    job_id = admit(two, "k1")
    two.block_provider("a", "dispatch_paused")
    two.slots.turn = 1  # the next claim would start at a
    running = claim(two, job_id)
    assert running is not None and running.server == "b" and held(two) == {"a": [], "b": [job_id]}


OTHER = "zeta"  # a tenant in the other shard


def members(store: Store, server: str) -> list[str]:
    return store.redis.zrange(keys.server_slots(server), 0, -1)


def test_a_duplicate_message_takes_a_slot_of_its_own_and_gives_back_only_that(two: Store) -> None:
    """A message of J read while J was queued, claimed after another worker's claim of J: its own
    attempt takes its own slot, finds J running and gives back that one slot, not the live attempt's."""
    job = admit(two, "k1")
    caps = {"a": 2}
    first = two.claim(job, worker="w1", lease_ms=60_000, operation_id="op-1", servers=caps)
    assert first is not None and members(two, "a") == [f"{job}/op-1"]
    took = two.slots.claim(job, "op-dup", caps, lambda on: None)  # as if its state read came first
    assert took is None and members(two, "a") == [f"{job}/op-1"]
    two.mark_submit(first, epoch="", lease_ms=60_000)  # still held: it is sent


def test_the_sweeper_never_frees_a_slot_confirmed_after_it_read_the_record(two: Store, monkeypatch) -> None:
    """keep reads J's record (not claimed yet: its worker stalled past the grace), then J's claim and its
    check before sending run, then keep's script: the check renewed the slot, so keep leaves it."""
    monkeypatch.setattr(slots, "GRACE_MS", 0)
    job = admit(two, "k1")
    assert two.slots.take("a", 1, f"{job}/op-{job}") == 1
    run = two.slots.scripts

    def stalled_worker_goes_on(verb, keys_, args, **kw):
        if verb == "slot-keep" and args[-1] != "":  # the sweeper's call (a score read), after its reads
            running = two._claim(job, worker="w", lease_ms=60_000, operation_id=f"op-{job}", servers={"a": 1},
                                 prices=None, provider="comfyui", min_attempt_ms=0, now_ms=None)
            two.mark_submit(running, epoch="", lease_ms=60_000)  # its check renews the slot
        return run(verb, keys_, args, **kw)

    monkeypatch.setattr(two.slots, "scripts", stalled_worker_goes_on)
    assert two.slots.keep({"a": 1}) == 0
    assert members(two, "a") == [f"{job}/op-{job}"]


def test_a_late_give_back_of_a_retried_attempt_leaves_the_next_attempts_slot(two: Store, monkeypatch) -> None:
    job = admit(two, "k1")
    caps = {"a": 2}
    first = two.claim(job, worker="w", lease_ms=60_000, operation_id="op-1", servers=caps)
    give = two.slots.give

    def late(server, claim, **kw):  # the next attempt is claimed before this give arrives
        assert two.promote(job) == "queued"
        again = two.claim(job, worker="w", lease_ms=60_000, operation_id="op-2", servers=caps)
        assert again is not None and again.server == "a"
        give(server, claim, **kw)

    monkeypatch.setattr(two.slots, "give", late)
    two.retry(first, delay_ms=0, error_class="dispatch_paused", free=True)
    assert members(two, "a") == [f"{job}/op-2"]


def test_a_called_job_gets_its_promised_server_with_shards(two: Store) -> None:
    """J1 is called for a, J2 for b (`c:<job id>`); J2's claim tries b first, whatever the turn."""
    caps = {"a": 1, "b": 1}
    take = lambda job_id: two.claim(job_id, worker="w", lease_ms=60_000, operation_id=f"op-{job_id}",  # noqa: E731
                                    servers=caps)
    x, y = take(admit(two, "x")), take(admit(two, "y"))
    j1, j2 = admit(two, "j1"), admit(two, "j2")
    assert take(j1) is None and take(j2) is None
    two.finish(x, "cancelled", reason="cancelled")
    two.finish(y, "cancelled", reason="cancelled")
    shard = keys.TenantKeys("acme").shard
    assert two.unpark(shard, caps) == [j1, j2]
    promised = two.redis.hmget(shard.fleet, [f"c:{j1}", f"c:{j2}"])
    two.slots.turn = len(caps) - 1  # the next claim would start at a
    assert take(j2).server == promised[1] and take(j1).server == promised[0]


def test_with_one_shard_the_sweeper_spends_nothing_on_server_slots(store: Store, settings, monkeypatch) -> None:
    from pipeline.work.sweeper import Sweeper

    sweeper = Sweeper(store, lambda *message: None, settings)
    for name in ("server_ms", "now_ms"):  # not even Redis's clock
        monkeypatch.setattr(store if name == "server_ms" else sweeper, name, lambda *a, **k: pytest.fail("read"))
    monkeypatch.setattr(store.slots, "keep", lambda servers: pytest.fail("kept"))
    assert store.slots.on is False
    sweeper.keep_slots()


class Rendering:
    """Server ``a``: every prompt is still running (a watcher's /history check renews, collects nothing)."""

    name, price_per_output, client_id = "a", 10, "reckon"

    def status(self, operation_id: str) -> OperationStatus:
        return OperationStatus("running")

    def offers(self) -> None:
        return None


def stall(store: Store, server: str, slot: str, ms: int) -> None:
    """``ms`` of Redis's clock pass for the slot without a sweeper: its score falls that far behind."""
    store.redis.zincrby(keys.server_slots(server), -ms, slot)


def test_a_sweeper_stalled_past_a_minute_leaves_a_watched_prompts_slot_taken(two: Store, settings: Settings) -> None:
    """A runs on `a` (cap 1), handed to the watcher, which renews its job's lease; the sweeper is stopped
    for 62 s (twice). Neither its first keep afterwards nor a claim from the other shard frees A's slot:
    the claim parks, and `a` never holds two prompts (on d89904b the keep pruned A's lapsed slot first,
    and a take pruned it too)."""
    a, lease = admit(two, "k1"), int(settings.lease_seconds * 1000)  # the watcher's lease
    running = two.claim(a, worker="w", lease_ms=lease, operation_id="op-a", servers={"a": 1})
    two.mark_submit(running, epoch="e1", lease_ms=lease)
    watched = two.await_provider(running, lease_ms=lease)
    clock = [1000.0]  # the watcher's monotonic seconds
    watch = ServerWatch("a", Fleet([Server("a", "http://a", 1)], lambda _: Rendering()), two,
                        lambda *message: pytest.fail("nothing to publish"), settings, record, lambda: clock[0])
    create_tenant(two.redis, OTHER, 10**6)
    assert keys.TenantKeys(OTHER).shard != keys.TenantKeys("acme").shard
    other = Admitter(two, lambda job_id, priority: None, settings)
    for n, keep_first in enumerate((False, True)):
        stall(two, "a", f"{a}/op-a", 62_000)
        clock[0] += 62
        watch.tick()  # the watcher asks /history ("running") and renews A's lease, as every third of it
        assert watch.renewed == {a: clock[0]}  # renewed (a fenced-out renewal is dropped from it)
        if keep_first:
            assert two.slots.keep({"a": 1}) == 0  # the sweeper's first pass after its stall
        z = other.submit(OTHER, f"z{n}", {"kind": "image", "workflow": WORKFLOW, "outputs": 1}).job_id
        assert two.claim(z, worker="w2", lease_ms=30_000, operation_id=f"op-{z}", servers={"a": 1}) is None
        assert two.job(z)["state"] == "queued" and two.redis.zscore(keys.JobKeys(z).shard.parked, z) is not None
        assert two.slots.keep({"a": 1}) == 0
        assert members(two, "a") == [f"{a}/op-a"]
    assert two.job(a)["state"] == "running" and two.watch_entry(a)["gen"] == watched.generation
    busy = [two.redis.hget(keys.ShardKeys(n).fleet, "busy:a") for n in range(2)]
    assert busy[keys.TenantKeys("acme").shard.n] == "1" and busy[keys.TenantKeys(OTHER).shard.n] in (None, "0")
