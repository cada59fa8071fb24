"""A review that leaves a prompt at its server keeps its slot (lua/_slots.lua ``keep_slot``) until the
watcher hears the prompt is gone (lua/slot-let-go.lua): a job sent to ``needs_review`` because its
reconciliation timed out while the server still said "running" never lets a second prompt onto a
server of cap 1. Real scripts, real redis-server, with one shard and two; the executor's reconciliation
and the watcher's checks run as they do in their processes, against a server whose answer the test sets,
on the watcher's injected clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import NotAllowed, StaleLease
from pipeline.fleet import Server
from pipeline.providers.base import OperationStatus
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state import keys, slots
from pipeline.state.progress import record
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor
from pipeline.work.watcher import ServerWatch
from tests.pipeline.conftest import WORKFLOW

CAPS = {"sim": 1}
OTHER = "zeta"  # with two shards, a tenant in the other shard than acme's


class Answers:
    """Server ``sim``: each prompt's state as the test sets it (``state``); it reads the same epoch."""

    name, price_per_output, client_id = "sim", 10, "reckon"

    def __init__(self) -> None:
        self.state = "running"
        self.asked: list[str] = []

    def status(self, operation_id: str) -> OperationStatus:
        self.asked.append(operation_id)
        return OperationStatus(self.state)

    def epoch(self) -> str:
        return "e1"

    def offers(self) -> None:
        return None


@dataclasses.dataclass
class Deployment:
    store: Store
    settings: Settings
    server: Answers
    fleet: Fleet
    published: list[tuple[str, str]]
    clock: list[float]
    caps: dict[str, int] = dataclasses.field(default_factory=lambda: dict(CAPS))

    def admit(self, tenant: str, key: str) -> str:
        if not self.store.redis.exists(keys.TenantKeys(tenant).ledger):
            create_tenant(self.store.redis, tenant, 10**6)
        admitter = Admitter(self.store, lambda job_id, priority: None, self.settings)
        return admitter.submit(tenant, key, {"kind": "image", "workflow": WORKFLOW, "outputs": 1}).job_id

    def claim(self, job_id: str, op: str = ""):
        return self.store.claim(job_id, worker="w", lease_ms=30_000, operation_id=op or f"op-{job_id}",
                                servers=self.caps)

    def watch(self, fleet: Fleet | None = None) -> ServerWatch:
        return ServerWatch("sim", fleet or self.fleet, self.store, lambda *message: self.published.append(message),
                           self.settings, lambda *point: record(self.store.scripts, *point), lambda: self.clock[0])

    def reviewed(self, tenant: str = "acme", key: str = "a") -> tuple[str, str]:
        """A job whose prompt still runs at `sim` when its reconciliation times out: it goes to review
        (`reconcile_timed_out`) as the executor sends it. Its id and its slot (`<job id>/<operation id>`)."""
        job_id = self.admit(tenant, key)
        held = self.claim(job_id)
        self.store.mark_submit(held, epoch="e1", lease_ms=30_000)
        held = self.store.await_provider(held, lease_ms=30_000)
        assert self.store.begin_reconcile(job_id, reason="lease_expired", claim=held)
        executor = Executor(self.store, self.fleet, BlobStore(self.settings.blob_dir),
                            dataclasses.replace(self.settings, reconcile_max_seconds=0.0))
        assert executor.reconcile(job_id) is True
        job = self.store.job(job_id)
        assert (job["state"], job["error_reason"]) == ("needs_review", "reconcile_timed_out")
        assert self.server.asked == [held.operation_id]  # the server said "running"
        self.server.asked.clear()
        return job_id, f"{job_id}/{held.operation_id}"

    def busy(self) -> int:
        return sum(int(self.store.redis.hget(shard.fleet, "busy:sim") or 0) for shard in keys.shards())

    def kept(self) -> list[str]:
        """The slots kept for prompts reviews left at their servers (`k:` in the shards' fleet hashes)."""
        return sorted(field[2:] for shard in keys.shards() for field in self.store.redis.hkeys(shard.fleet)
                      if field.startswith("k:"))

    def taken(self) -> list[str]:
        return self.store.redis.zrange(keys.server_slots("sim"), 0, -1)


@pytest.fixture(params=[1, 2], ids=["one-shard", "two-shards"])
def deployed(request: pytest.FixtureRequest, redis_client: Any, settings: Settings) -> Iterator[Deployment]:
    store = Store(redis_client, shards=request.param)
    server = Answers()
    yield Deployment(store, settings, server, Fleet([Server("sim", "http://sim", 1)], lambda _: server), [], [1000.0])
    keys.use_shards(1)


def test_a_review_of_a_prompt_still_running_keeps_its_slot_until_the_server_says_it_ended(
        deployed: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next claim parks while the server says "running" (on d89904b review.lua gave the slot back and
    it claimed: two prompts on a server of cap 1); the sweeper's keep leaves the server's slot taken past
    the grace; once the server says the prompt completed, the watcher gives the slot back and calls the
    parked job, which claims it."""
    d = deployed
    job_id, slot = d.reviewed()
    b = d.admit(OTHER if d.store.slots.on else "acme", "b")
    assert d.claim(b) is None and d.store.job(b)["state"] == "queued"
    assert (d.busy(), d.kept(), d.store.job(job_id)["slot_held"]) == (1, [slot], "0")
    monkeypatch.setattr(slots, "GRACE_MS", 0)
    assert d.store.slots.keep(CAPS) == 0 and d.taken() == ([slot] if d.store.slots.on else [])
    watch = d.watch()
    watch.tick()  # asks /history about the kept prompt: still running
    assert d.server.asked == [slot.partition("/")[2]] and (d.busy(), d.kept(), d.published) == (1, [slot], [])
    d.server.state = "completed"
    d.clock[0] += d.settings.watch_recheck_seconds  # the next check of it is due
    watch.tick()
    call = [f"{b}/call"] if d.store.slots.on else []  # its call reserves the slot (fair dispatch across shards)
    assert (d.busy(), d.kept(), d.taken(), d.published) == (0, [], call, [(b, "unparked")])
    running = d.claim(b)
    assert running is not None and running.server == "sim" and d.busy() == 1
    assert d.taken() == ([f"{b}/{running.operation_id}"] if d.store.slots.on else [])  # taken over
    assert d.store.job(job_id)["state"] == "needs_review"  # the operator still decides the job


@pytest.mark.parametrize("answer", ["unknown", "failed"])
def test_a_kept_slot_is_given_back_when_the_server_no_longer_has_the_prompt(deployed: Deployment, answer: str) -> None:
    """No record of it (a restart emptied the queue) or an end of any kind: the prompt no longer occupies
    the server."""
    d = deployed
    _, slot = d.reviewed()
    d.server.state = answer
    d.watch().tick()
    assert (d.busy(), d.kept(), d.taken()) == (0, [], [])


def test_an_operator_resolving_the_review_leaves_the_slot_with_the_prompt(deployed: Deployment) -> None:
    """The operator asks to retry the job while its first prompt still runs: refused, naming the server
    (the slot stays with that prompt; on 56716bc the retry was queued and the hold returned); once the
    server says the prompt ended, the slot is given back and the retry runs."""
    d = deployed
    job_id, slot = d.reviewed()
    with pytest.raises(NotAllowed, match="server sim may still run the job's prompt"):
        d.store.resolve_review(job_id, "retry", reason="operator_retry")
    assert d.store.job(job_id)["state"] == "needs_review" and d.kept() == [slot]
    d.server.state = "failed"
    d.watch().tick()
    assert (d.busy(), d.kept(), d.published) == (0, [], [])
    assert d.store.resolve_review(job_id, "retry", reason="operator_retry") == "queued"
    again = d.claim(job_id, "op-2")
    assert again is not None and d.busy() == 1 and d.taken() == ([f"{job_id}/op-2"] if d.store.slots.on else [])


def test_a_watcher_not_configured_with_the_server_leaves_its_kept_slot(deployed: Deployment) -> None:
    """A watcher whose settings lack `sim` (not yet restarted after `sim` was added, or `sim` removed: it
    cannot tell which) leaves the slot of `sim`'s running prompt taken: the next claim parks (on 56716bc
    it gave the slot back and a second prompt went to `sim`, of cap 1). Only `reckon provider forget sim`
    (``ServerSlots.forget``) gives it back without `sim`'s word; a second forget frees nothing."""
    d = deployed
    job_id, slot = d.reviewed()
    older = Fleet([Server("sim2", "http://sim2", 1)], lambda _: d.server)
    ServerWatch("sim2", older, d.store, lambda *message: d.published.append(message), d.settings,
                lambda *point: record(d.store.scripts, *point), lambda: d.clock[0]).tick()
    assert (d.busy(), d.kept(), d.taken(), d.server.asked) == (1, [slot], [slot] if d.store.slots.on else [], [])
    b = d.admit(OTHER if d.store.slots.on else "acme", "b")
    assert d.claim(b) is None and d.store.job(b)["state"] == "queued"
    assert d.store.slots.forget("sim2") == [] and d.kept() == [slot]
    assert d.store.slots.forget("sim") == [slot]
    assert (d.busy(), d.kept(), d.taken(), d.store.slots.forget("sim")) == (0, [], [], [])
    assert d.store.job(job_id)["uncertain"] == "10"  # nobody can say what ran: the hold stays for the operator
    running = d.claim(b)
    assert running is not None and running.server == "sim" and d.busy() == 1


def test_a_slot_given_back_twice_is_given_back_once_and_a_give_back_cut_short_is_finished_by_the_sweeper(
        deployed: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two watchers (a standby that took over) give the same kept slot back: the count drops by one. A
    watcher that died after the shard's script and before the server's key: the sweeper frees that
    slot after the grace (nothing holds it any more)."""
    d = deployed
    d.caps = {"sim": 2}
    _, slot = d.reviewed()
    other, other_slot = d.reviewed(key="c")
    assert (d.busy(), d.kept()) == (2, sorted([slot, other_slot]))
    job = keys.JobKeys(other)
    let_go = [job.shard.fleet, job.record, job.tenant.ledger, *job.shard.globals]
    assert d.store.scripts("slot-let-go", let_go, [other_slot, ""]) == [0, 1, 0]  # then it died
    assert d.store.scripts("slot-let-go", let_go, [other_slot, ""]) == [0, 0, 0]
    assert (d.busy(), d.kept()) == (1, [slot])
    monkeypatch.setattr(slots, "GRACE_MS", 0)
    assert d.store.slots.keep(d.caps) == (1 if d.store.slots.on else 0)
    assert d.taken() == ([slot] if d.store.slots.on else [])


def test_a_repeated_review_is_fenced_out_and_keeps_the_slot_once(deployed: Deployment) -> None:
    """The review's call again with the same claim (a retried call, a second reconciler's stale one): it
    is fenced out (StaleLease) and keeps nothing more; the count stays at one."""
    d = deployed
    job_id = d.admit("acme", "a")
    held = d.claim(job_id)
    d.store.mark_submit(held, epoch="e1", lease_ms=30_000)
    assert d.store.begin_reconcile(job_id, reason="lease_expired", claim=held)
    rec = d.store.claim_reconcile(job_id, worker="r", lease_ms=30_000)
    d.store.send_to_review(rec.claim, expires_in_ms=60_000, reason="reconcile_timed_out", keep_slot=True)
    with pytest.raises(StaleLease):
        d.store.send_to_review(rec.claim, expires_in_ms=60_000, reason="reconcile_timed_out", keep_slot=True)
    assert (d.busy(), d.kept(), d.taken()) == (1, [f"{job_id}/{held.operation_id}"],
                                               [f"{job_id}/{held.operation_id}"] if d.store.slots.on else [])
