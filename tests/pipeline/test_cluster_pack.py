"""Redis Cluster: a step that packs a finished job declares every key it packs (``parts_at``).

During a slot's migration (``redis-cli --cluster reshard``, tests/cluster.py ``move_slot``) the source
checks a call's *declared* keys before it runs it: if some are already gone it answers TRYAGAIN / ASK and
runs nothing, so a step either happens whole or not at all. A key a script touches without declaring it
is checked only when the script reaches it: one that the source does not hold (never written, such as
the attempts of a job that never ran or the progress of a job that reported none, or moved already)
would fail the script right there, after the writes it made directly (ledger, indexes, events) and
before the per-call copies are written back (the record's state and money, the shard's figures). These
tests failed so when the packed keys were named inside the script (the review of the change).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from pipeline.claims import Claim
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.status import audit
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant
from tests import cluster
from tests.lua.test_scripts import NOW

#: What a step refused whole during a migration raises (TRYAGAIN until the client's retries run out).
REFUSED = (redis.ResponseError, redis.exceptions.ClusterError)


def _admit(store: Store, n: int) -> str:
    job_id = f"acme.{n:020d}"
    record = {"id": job_id, "tenant": "acme", "state": "queued", "kind": "image", "priority": "batch",
              "outputs_requested": "1", "ceiling": "30", "price": "10", "reserved": "30", "charged": "0",
              "uncertain": "0", "settled": "0", "attempt_count": "0", "lease_gen": "0", "per_attempt": "10",
              "deadline_s": "86400", "attempts_allowed": "3", "deadline": str(NOW + 86_400_000),
              "created_at": str(NOW), "updated_at": str(NOW), "idem_key": f"k{n}"}
    store.admit("acme", f"k{n}", job_id, fingerprint="fp", ceiling=30, fields=record, workflow=b"{}", status=202,
                now_ms=NOW, idem_ttl_s=600, outbox_delay_ms=10_000)
    return job_id


def _claim(store: Store, job_id: str, servers: dict[str, int], op: str) -> Any:
    return store.claim(job_id, worker="w1", now_ms=NOW + 10, lease_ms=3_600_000, operation_id=op, servers=servers)


@pytest.fixture
def busy_tenant(request: pytest.FixtureRequest, store: Store) -> dict[str, str]:
    """A tenant as a busy one is: a dead letter (done, dead), a job waiting to retry, one in review, one
    running and one parked behind it, and one running under the poller (RECKON_WATCH=0: no progress)."""
    create_tenant(store.redis, "acme", 10_000)
    jobs = {name: _admit(store, n) for n, name in enumerate(
        ("dead", "retry", "review", "holder", "parked", "polled", "reconciling"), start=1)}
    big = {"sim": 100}
    store.finish(_claim(store, jobs["dead"], big, "op-d"), "failed", error_class="provider_rejected",
                 reason="provider_rejected", now_ms=NOW + 20)
    store.retry(_claim(store, jobs["retry"], big, "op-r"), delay_ms=10**9, error_class="provider_unavailable",
                now_ms=NOW + 20)
    held = _claim(store, jobs["review"], big, "op-v")
    store.mark_submit(held, epoch="e1", lease_ms=3_600_000, now_ms=NOW + 15)
    store.begin_reconcile(jobs["review"], reason="unknown", claim=held, now_ms=NOW + 20)
    rec = store.claim_reconcile(jobs["review"], worker="r1", lease_ms=60_000, now_ms=NOW + 21)
    store.send_to_review(rec.claim, expires_in_ms=10**9, reason="unknowable", now_ms=NOW + 22)
    assert _claim(store, jobs["holder"], {"one": 1}, "op-h") is not None
    assert _claim(store, jobs["parked"], {"one": 1}, "op-p") is None  # parked: the one slot is taken
    held = _claim(store, jobs["reconciling"], big, "op-rc")
    store.mark_submit(held, epoch="e1", lease_ms=3_600_000, now_ms=NOW + 15)
    store.begin_reconcile(jobs["reconciling"], reason="unknown", claim=held, now_ms=NOW + 20)
    return jobs


@pytest.fixture
def migrating(redis_cluster: cluster.Cluster) -> Iterator[Callable[[], None]]:
    """Starts moving the slot of acme's shard to another primary (IMPORTING / MIGRATING set, as
    ``move_slot`` and ``redis-cli --cluster reshard`` set them before the first MIGRATE); put back after."""
    slot = key_slot(f"{{s{TenantKeys('acme').shard.n}}}".encode())
    owner = cluster.owner_of(redis_cluster, slot)
    other = next(port for port in redis_cluster.ports if port != owner)
    source, target = redis.Redis(port=owner), redis.Redis(port=other)

    def start() -> None:
        target.cluster("SETSLOT", slot, "IMPORTING", source.cluster("MYID").decode())
        source.cluster("SETSLOT", slot, "MIGRATING", target.cluster("MYID").decode())

    try:
        yield start
    finally:
        for node in (source, target):
            node.cluster("SETSLOT", slot, "STABLE")
            node.close()


def _money(store: Store) -> tuple[dict[str, int], dict[str, int]]:
    """The tenant ledger, and what its jobs hold (reserved = their reserved + charged)."""
    ledger = store.ledger("acme")
    held = {"reserved": 0, "uncertain": 0, "settled": 0}
    for job_id in store.redis.zrange(TenantKeys("acme").jobs, 0, -1):
        r = store.job(job_id)
        held["reserved"] += int(r["reserved"]) + int(r.get("charged", 0))
        held["uncertain"] += int(r.get("uncertain", 0))
        held["settled"] += int(r["settled"])
    return {k: ledger[k] for k in held}, held


def _problems(store: Store, job_id: str, failed: Exception | None, index: str, live_state: str,
              end_state: str) -> list[str]:
    """What is out of step after the step: the ledger against the jobs' buckets, the job's state against
    the index its state keeps it in, the shard's figures against the jobs (``reckon stats audit``)."""
    ledger, held = _money(store)
    record = store.job(job_id) or {}
    indexed = store.redis.zscore(getattr(TenantKeys("acme"), index), job_id) is not None
    found = [f"the step {'failed: ' + str(failed) if failed else 'succeeded'}"]
    if ledger != held:
        found.append(f"ledger {ledger} != what its jobs hold {held}")
    if (record.get("state"), indexed) not in ((live_state, True), (end_state, False)):
        found.append(f"job {record.get('state')} but {'in' if indexed else 'not in'} the {index} index")
    found += [f"audit: {problem}" for problem in audit(store.redis, store.tenants())]
    return found


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_cancel_during_a_slot_migration_happens_whole_or_not_at_all(busy_tenant: dict[str, str], store: Store,
                                                                     migrating: Callable[[], None]) -> None:
    """A queued (parked) job cancelled while its slot migrates: its attempts key was never written. Named
    inside the script, its HGETALL failed the script after the ledger released the reservation, the job
    left the queued index and its `cancelled` event was appended, but before its record (state, reserved)
    and the shard's figures said so; a retry of the cancel released the reservation a second time.
    Declared, the step is refused whole (TRYAGAIN) and the job stays queued, its money where it was."""
    job_id = busy_tenant["parked"]
    assert _problems(store, job_id, None, "queued", "queued", "cancelled")[1:] == []
    migrating()
    try:
        store.cancel(job_id)
        failed = None
    except REFUSED as exc:
        failed = exc
    found = _problems(store, job_id, failed, "queued", "queued", "cancelled")
    assert found[1:] == [], "\n".join(found)


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_finish_during_a_slot_migration_happens_whole_or_not_at_all(busy_tenant: dict[str, str], store: Store,
                                                                     migrating: Callable[[], None]) -> None:
    """A job run under the poller (RECKON_WATCH=0: no progress points, so no progress keys) finishes while
    its slot migrates. Named inside the script, the DEL of the progress keys failed it after the ledger
    settled, the lease index dropped the job and its slot was given back, but before its record left
    `running`: a job no sweeper would reconcile, settled in the ledger but not on its record. Declared,
    the step is refused whole and the job is still running under its lease (docs/failover.md "Resharding while jobs
    run": a worker step that fails is recovered like any other, lease expiry and reconcile)."""
    job_id = busy_tenant["holder"]
    held_claim = Claim(job_id, 1, 1, "op-h", NOW + 10, "one")  # the holder's worker (generation 1, attempt 1)
    store.store_output(held_claim, 0, {"sha256": "a" * 64, "bytes": 1, "content_type": "image/png"}, now_ms=NOW + 30)
    store.charge(held_claim, 10)
    j = JobKeys(job_id)
    assert store.redis.exists(j.progress, j.progress_seen) == 0  # nothing reported progress
    migrating()
    try:
        store.finish(held_claim, "completed", now_ms=NOW + 40)
        failed = None
    except REFUSED as exc:
        failed = exc
    found = _problems(store, job_id, failed, "leases", "running", "completed")
    assert found[1:] == [], "\n".join(found)
