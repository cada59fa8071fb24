"""The Lua scripts, called through their typed wrappers against a real redis-server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from pipeline.errors import IncompleteOutputs, ScriptError, StaleLease
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import LUA_DIR, SEPARATE, Code, Scripts, key_count
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant

#: Every test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True
NOW = 1_700_000_000_000


def admit(store: Store, key: str = "k1", job_id: str = "acme.00000000000000000001", ceiling: int = 30,
          fingerprint: str = "fp", outputs: int = 1):
    record = {"id": job_id, "tenant": "acme", "state": "queued", "kind": "image", "priority": "batch",
              "workflow": "{}", "outputs_requested": str(outputs), "ceiling": str(ceiling), "price": "10",
              "reserved": str(ceiling), "charged": "0", "uncertain": "0", "settled": "0", "attempt_count": "0",
              "lease_gen": "0", "per_attempt": str(10 * outputs), "deadline_s": "60",
              "attempts_allowed": "3", "deadline": str(NOW + 60_000), "created_at": str(NOW),
              "updated_at": str(NOW), "idem_key": key}
    return store.admit("acme", key, job_id, fingerprint=fingerprint, ceiling=ceiling, fields=record, workflow=b"{}",
                       status=202, now_ms=NOW, idem_ttl_s=60, outbox_delay_ms=10_000)


def claim(store: Store, job_id: str = "acme.00000000000000000001", now: int = NOW, op: str = "op-1"):
    return store.claim(job_id, worker="w1", now_ms=now, lease_ms=1000, operation_id=op, servers={"sim": 1000})


@pytest.fixture
def acme(store: Store) -> Store:
    """The store, its idempotency records kept 60 s as `admit` asks."""
    create_tenant(store.redis, "acme", 100)
    return Store(store.redis, store.scripts, idem_ttl_s=60)


def record_of(store: Store, key: str, now: int = NOW) -> str | None:
    """The idempotency record of ``key`` in its window at ``now`` (its expiry after a space), else None."""
    return store.redis.hget(TenantKeys("acme").idempotency_window(now // 1000 // 60), key)


def test_every_script_declares_its_key_count_and_has_a_header() -> None:
    paths = [p for p in Path(LUA_DIR).glob("*.lua") if not p.name.startswith("_") and p.name not in SEPARATE]
    assert len(paths) == 43  # workflow-save.lua (issue 34)
    for path in paths:
        text = path.read_text()
        nkeys = key_count(path.name, text)
        assert text.startswith("-- "), path.name
        assert f"KEYS[{nkeys}]" in text and f"KEYS[{nkeys + 1}]" not in text, path.name
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
        used = {int(i) for i in re.findall(r"KEYS\[([0-9]+)\]", code)}
        for first in re.findall(r"use_globals\(([0-9]+)\)", code):  # the three global keys, from KEYS[first]
            used |= set(range(int(first), int(first) + 3))
        for first in re.findall(r"parts_at\(([0-9]+)\)", code):  # a job's five parts, from KEYS[first]
            used |= set(range(int(first), int(first) + 5))
        for first in re.findall(r"parked_indexes\(([0-9]+),", code):  # the parked indexes, from KEYS[first]
            used.add(int(first))
        assert sorted(set(range(1, nkeys + 1)) ^ used) == [], path.name  # every key is used, none beyond
        assert "redis.call('KEYS'" not in text and "SCAN" not in text, path.name


def test_a_script_body_keeps_its_reply_shape_and_error_replies(store: Store, tmp_path: Path) -> None:
    for shared in Path(LUA_DIR).glob("_*.lua"):
        (tmp_path / shared.name).write_text(shared.read_text())
    (tmp_path / "table.lua").write_text("-- a table with a nested one\n-- keys: 0\nreturn {0, 'a', {1, 2}}")
    (tmp_path / "nothing.lua").write_text("-- no reply\n-- keys: 0\nlocal x = 1")
    (tmp_path / "fail.lua").write_text("-- an error reply\n-- keys: 0\nreturn redis.error_reply('boom')")
    scripts = Scripts(store.redis, lua_dir=tmp_path)
    assert scripts("table", [], []) == [0, "a", [1, 2]] and scripts("nothing", [], []) == []
    with pytest.raises(redis.ResponseError, match="boom"):
        scripts("fail", [], [])


def test_wrong_key_count_is_refused_before_redis(store: Store) -> None:
    with pytest.raises(ScriptError):
        Scripts(store.redis)("heartbeat", ["only-one"], [1, 2, 3])


def test_admit_reserves_and_creates_then_replays(acme: Store) -> None:
    first = admit(acme)
    assert first.code is Code.CREATED
    assert acme.ledger("acme") == {"allowance": 100, "reserved": 30, "uncertain": 0, "settled": 0, "available": 70}
    replay = admit(acme, job_id="acme.00000000000000000002")
    assert replay.code is Code.IN_PROGRESS  # not yet confirmed published
    acme.confirm_published(first.job_id, "k1", now_ms=NOW)
    replay = admit(acme, job_id="acme.00000000000000000002")
    assert (replay.code, replay.job_id, replay.status) == (Code.REPLAYED, first.job_id, 202)
    # a field of its window's hash, with its expiry (s); no body (a replay rebuilds it); the job id past its tenant
    assert record_of(acme, "k1") == f"d202 fp {first.job_id.split('.')[1]} {NOW // 1000 + 60}"  # fp: no hex
    assert acme.redis.exists(TenantKeys("acme").idempotency("k1")) == 0  # no key of its own
    assert 0 < acme.redis.ttl(TenantKeys("acme").idempotency_window(NOW // 1000 // 60)) <= 120
    assert admit(acme, fingerprint="other").code is Code.FINGERPRINT_MISMATCH
    assert acme.ledger("acme")["reserved"] == 30
    assert acme.redis.zcard(TenantKeys("acme").jobs) == 1
    assert acme.state_counts("acme") == {"queued": 1}


def test_an_idempotency_record_an_earlier_version_wrote_as_a_hash_still_answers(acme: Store) -> None:
    first = admit(acme)
    key = TenantKeys("acme").idempotency("k1")
    acme.redis.hdel(TenantKeys("acme").idempotency_window(NOW // 1000 // 60), "k1")
    acme.redis.hset(key, mapping={"fingerprint": "fp", "job_id": first.job_id, "state": "pending", "status": "202"})
    assert admit(acme, job_id="acme.00000000000000000002").code is Code.IN_PROGRESS
    acme.confirm_published(first.job_id, "k1", now_ms=NOW)
    assert acme.redis.hget(key, "state") == "done"
    replay = admit(acme, job_id="acme.00000000000000000002")
    assert (replay.code, replay.job_id, replay.status) == (Code.REPLAYED, first.job_id, 202)
    assert admit(acme, fingerprint="other").code is Code.FINGERPRINT_MISMATCH
    assert acme.redis.zcard(TenantKeys("acme").jobs) == 1


DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def idem_digits(hex_digits: str) -> str:
    """What lua/_idem.lua's `idem_digits` writes, spelt out here to check it: two for three hex digits,
    one for each of the one or two left over."""
    whole = len(hex_digits) // 3 * 3
    out = [DIGITS[int(hex_digits[i:i + 3], 16) // 64] + DIGITS[int(hex_digits[i:i + 3], 16) % 64]
           for i in range(0, whole, 3)]
    return "".join(out) + "".join(DIGITS[int(d, 16)] for d in hex_digits[whole:])


def test_an_idempotency_record_keeps_60_bits_of_the_fingerprint_in_its_window_and_reads_earlier_forms(
        acme: Store) -> None:
    """A record keeps the first 15 hex digits of the fingerprint and the job id past its tenant, both as
    IDEM_DIGITS (28 bytes), and its expiry, as a field of its window's hash. The full fingerprint matches
    it, a body whose fingerprint differs only past them matches too (a chance in 2^60), any other differs;
    the records earlier versions wrote as their own keys (`d202<24 digits>`, `d202 <16 hex> <20 hex>`, `done 202 <fingerprint> <job id>`)
    still answer until they expire."""
    full = "0123456789abcdef" + "f" * 48
    first = admit(acme, fingerprint=full, job_id="acme.0123456789abcdef0123")
    key, window = TenantKeys("acme").idempotency("k1"), TenantKeys("acme").idempotency_window(NOW // 1000 // 60)
    compact = "p202" + idem_digits(full[:15]) + idem_digits("0123456789abcdef0123")
    assert record_of(acme, "k1") == f"{compact} {NOW // 1000 + 60}" and compact == "p202ASNFZ4mrzeASNFZ4mrze8BCD"
    assert admit(acme, job_id="acme.00000000000000000002", fingerprint=full).code is Code.IN_PROGRESS
    acme.confirm_published(first.job_id, "k1", now_ms=NOW)
    assert record_of(acme, "k1") == f"d{compact[1:]} {NOW // 1000 + 60}"
    replay = admit(acme, job_id="acme.00000000000000000002", fingerprint=full)
    assert (replay.code, replay.job_id, replay.status) == (Code.REPLAYED, first.job_id, 202)
    assert admit(acme, fingerprint="0123456789abcdee" + "f" * 48).code is Code.REPLAYED  # past 15 digits
    assert admit(acme, fingerprint="0123456789abcdff" + "f" * 48).code is Code.FINGERPRINT_MISMATCH
    acme.redis.delete(window)  # the records earlier versions wrote, each as its own key
    for old in (f"p202 0123456789abcdef {first.job_id.split('.')[1]}", "p" + compact[1:]):
        acme.redis.set(key, old, ex=60)
        assert admit(acme, job_id="acme.00000000000000000002", fingerprint=full).code is Code.IN_PROGRESS
        acme.confirm_published(first.job_id, "k1", now_ms=NOW)
        assert acme.redis.get(key)[:1] == "d" and 0 < acme.redis.ttl(key) <= 60
    assert admit(acme, fingerprint="0123456789abcdee" + "f" * 48).code is Code.REPLAYED
    acme.redis.set(key, f"d202 0123456789abcdef {first.job_id.split('.')[1]}", ex=60)
    assert admit(acme, fingerprint="0123456789abcdee" + "f" * 48).code is Code.FINGERPRINT_MISMATCH  # 16 kept
    acme.redis.set(key, f"pending 202 {full} {first.job_id}", ex=60)
    assert admit(acme, job_id="acme.00000000000000000002", fingerprint=full).code is Code.IN_PROGRESS
    acme.confirm_published(first.job_id, "k1", now_ms=NOW)
    assert acme.redis.get(key) == "d" + compact[1:]
    acme.redis.set(key, f"done 202 {full} {first.job_id}", ex=60)
    replay = admit(acme, job_id="acme.00000000000000000002", fingerprint=full)
    assert (replay.code, replay.job_id, replay.status) == (Code.REPLAYED, first.job_id, 202)
    assert admit(acme, fingerprint="0123456789abcdef" + "e" * 48).code is Code.FINGERPRINT_MISMATCH
    assert acme.redis.zcard(TenantKeys("acme").jobs) == 1


def test_an_idempotency_record_answers_until_its_own_expiry_across_windows(acme: Store) -> None:
    """A record answers until its expiry, also from the window before the current one; past it, the key
    admits a new job, and the window it was written in expires two TTLs after its last write."""
    start = (NOW // 60_000 + 1) * 60_000 - 1_000  # a second before a window ends
    first = acme.admit("acme", "k1", "acme.00000000000000000001", fingerprint="fp", ceiling=30,
                       fields={"id": "acme.00000000000000000001", "tenant": "acme", "state": "queued", "kind": "image",
                               "priority": "batch", "outputs_requested": "1", "ceiling": "30", "price": "10",
                               "deadline_s": "60", "idem_key": "k1"},
                       workflow=b"{}", status=202, now_ms=start, idem_ttl_s=60, outbox_delay_ms=10_000)
    assert first.code is Code.CREATED
    acme.confirm_published(first.job_id, "k1", now_ms=start + 30_000)  # in the next window: found in the one before
    assert record_of(acme, "k1", start) == f"d202 fp 00000000000000000001 {start // 1000 + 60}"
    again = admit(acme, job_id="acme.00000000000000000002")
    for now, code in ((start + 59_000, Code.REPLAYED), (start + 60_000, Code.CREATED)):
        reply = acme.admit("acme", "k1", "acme.00000000000000000002", fingerprint="fp", ceiling=30,
                           fields={"id": "acme.00000000000000000002", "tenant": "acme", "state": "queued",
                                   "kind": "image", "priority": "batch", "outputs_requested": "1", "ceiling": "30",
                                   "price": "10", "deadline_s": "60", "idem_key": "k1"},
                           workflow=b"{}", status=202, now_ms=now, idem_ttl_s=60, outbox_delay_ms=10_000)
        assert reply.code is code, now - start
    assert again.code is Code.REPLAYED and reply.job_id == "acme.00000000000000000002"
    assert record_of(acme, "k1", start + 60_000) == f"p202 fp 00000000000000000002 {(start + 60_000) // 1000 + 60}"
    assert 60 < acme.redis.ttl(TenantKeys("acme").idempotency_window(start // 60_000)) <= 120


def test_an_idempotency_record_of_other_digits_is_spelt_out(acme: Store) -> None:
    """A fingerprint or job id not of lowercase hex (as no request makes them) is kept in the spaced form
    and answers as the compact one does."""
    first = admit(acme, fingerprint="fp", job_id="acme.00000000000000000001")
    key = TenantKeys("acme").idempotency("k1")
    assert record_of(acme, "k1") == f"p202 fp 00000000000000000001 {NOW // 1000 + 60}"
    acme.confirm_published(first.job_id, "k1", now_ms=NOW)
    replay = admit(acme, job_id="acme.00000000000000000002", fingerprint="fp")
    assert (replay.code, replay.job_id) == (Code.REPLAYED, first.job_id)
    other = admit(acme, key="k2", fingerprint="AB" * 32, job_id="acme.00000000000000000002")
    assert record_of(acme, "k2") == "p202 " + "AB" * 7 + f"A 00000000000000000002 {NOW // 1000 + 60}"
    again = admit(acme, key="k2", fingerprint="AB" * 32, job_id="acme.00000000000000000003")
    assert (again.code, again.job_id) == (Code.IN_PROGRESS, other.job_id)


def test_admit_refuses_over_allowance_and_writes_nothing(acme: Store) -> None:
    refused = admit(acme, ceiling=101)
    assert (refused.code, refused.available, refused.ceiling) == (Code.INSUFFICIENT_ALLOWANCE, 100, 101)
    assert acme.redis.exists(JobKeys("acme.00000000000000000001").record) == 0
    assert record_of(acme, "k1") is None
    assert acme.ledger("acme")["reserved"] == 0


def test_claim_fences_and_only_once(acme: Store) -> None:
    admit(acme)
    first = claim(acme)
    assert first is not None and (first.generation, first.attempt) == (1, 1)
    assert claim(acme, op="op-2") is None  # running under a live lease: duplicate delivery is a no-op
    attempts = acme.attempts(first.job_id)
    assert [(a["number"], a["operation_id"], a["state"]) for a in attempts] == [(1, "op-1", "running")]
    assert acme.redis.zscore(TenantKeys("acme").leases, first.job_id) == NOW + 1000
    assert acme.redis.zcard(TenantKeys("acme").outbox) == 1  # until confirmed: that marks the key done


def test_stale_generation_cannot_write(acme: Store) -> None:
    admit(acme)
    old = claim(acme)
    assert acme.begin_reconcile(old.job_id, now_ms=NOW + 999, reason="lease_expired") is False
    assert acme.begin_reconcile(old.job_id, now_ms=NOW + 1000, reason="lease_expired") is True
    with pytest.raises(StaleLease):  # the takeover itself fences the old worker out
        acme.heartbeat(old, now_ms=NOW + 1000, lease_ms=1000)
    rec = acme.claim_reconcile(old.job_id, worker="r1", now_ms=NOW + 1001, lease_ms=1000)
    new = rec.claim
    assert (new.generation, new.attempt, new.operation_id, rec.submitted) == (3, 1, "op-1", False)
    assert acme.claim_reconcile(old.job_id, worker="r2", now_ms=NOW + 1002, lease_ms=1000) is None
    for write in (
        lambda: acme.heartbeat(old, now_ms=NOW + 1002, lease_ms=1000),
        lambda: acme.store_output(old, 0, {"sha256": "a" * 64}, now_ms=NOW + 1002),
        lambda: acme.charge(old, 10),
        lambda: acme.finish(old, "completed", now_ms=NOW + 1002),
    ):
        with pytest.raises(StaleLease):
            write()
    assert acme.redis.hget(TenantKeys("acme").shard.stats, "stale_writes_rejected") == "5"
    assert acme.outputs(new.job_id) == {}
    assert acme.job(new.job_id)["state"] == "reconciling"
    assert [a["state"] for a in acme.attempts(new.job_id)] == ["unknown"]


def test_finish_needs_all_outputs_and_settles_once(acme: Store) -> None:
    admit(acme, outputs=2)
    held = claim(acme)
    acme.store_output(held, 0, {"sha256": "a" * 64}, now_ms=NOW)
    assert acme.charge(held, 20) == 20
    assert acme.charge(held, 20) == 0  # once per attempt
    with pytest.raises(IncompleteOutputs):
        acme.finish(held, "completed", now_ms=NOW)
    assert acme.store_output(held, 1, {"sha256": "b" * 64}, now_ms=NOW) is True
    assert acme.store_output(held, 1, {"sha256": "c" * 64}, now_ms=NOW) is False  # first record kept
    acme.finish(held, "completed", now_ms=NOW + 5)
    with pytest.raises(StaleLease):  # the job is no longer running: a second finish changes nothing
        acme.finish(held, "completed", now_ms=NOW + 6)
    assert acme.ledger("acme") == {"allowance": 100, "reserved": 0, "uncertain": 0, "settled": 20, "available": 80}
    job = acme.job(held.job_id)
    assert (job["state"], job["reserved"], job["settled"]) == ("completed", "0", "20")
    assert acme.state_counts("acme") == {"queued": 0, "running": 0, "completed": 1}
    assert [(e["from"], e["to"]) for e in acme.events(held.job_id)] == [
        (None, "queued"), ("queued", "running"), ("running", "completed")]
    assert acme.outputs(held.job_id)[1]["sha256"] == "b" * 64


def test_a_claim_hands_back_the_outputs_earlier_attempts_stored(acme: Store) -> None:
    admit(acme, outputs=2)
    first = claim(acme)
    assert (first.attempt, first.inputs.stored) == (1, frozenset())
    acme.store_output(first, 1, {"sha256": "a" * 64}, now_ms=NOW + 1)
    acme.retry(first, delay_ms=0, error_class="transient", now_ms=NOW + 2)
    assert acme.promote(first.job_id, now_ms=NOW + 3) == "queued"
    second = claim(acme, now=NOW + 4, op="op-2")
    assert (second.attempt, second.inputs.stored) == (2, frozenset({1}))


def test_the_watch_list_holds_a_job_exactly_while_the_watcher_holds_its_lease(acme: Store) -> None:
    fleet = TenantKeys("acme").shard.fleet
    admit(acme)
    acme.redis.hset(JobKeys("acme.00000000000000000001").record, "ckpt", "0123456789abcdef")
    worker = claim(acme)
    acme.mark_submit(worker, epoch="e", lease_ms=1000, now_ms=NOW + 10)
    watched = acme.await_provider(worker, lease_ms=1000, now_ms=NOW + 20)
    assert list(acme.watched()) == [worker.job_id]
    assert acme.watched()[worker.job_id]["ckpt"] == "0123456789abcdef"  # the watcher's run clock keeps it
    collector = acme.collect_claim(worker.job_id, worker="w2", lease_ms=1000, now_ms=NOW + 30).claim
    assert acme.watched() == {}
    with pytest.raises(StaleLease):  # the watcher's generation ended with the collect
        acme.heartbeat(watched, lease_ms=1000, now_ms=NOW + 31)
    acme.store_output(collector, 0, {"sha256": "a" * 64}, now_ms=NOW + 40)
    acme.finish(collector, "completed", now_ms=NOW + 50)  # taken off the list by the collect already
    assert acme.watched() == {} and acme.redis.hget(fleet, "busy:sim") == "0"

    admit(acme, key="k2", job_id="acme.00000000000000000002")
    worker = claim(acme, job_id="acme.00000000000000000002")
    acme.mark_submit(worker, epoch="e", lease_ms=1000, now_ms=NOW + 60)
    watched = acme.await_provider(worker, lease_ms=1000, now_ms=NOW + 70)
    assert "ckpt" not in acme.watched()[worker.job_id]  # a job without a checkpoint: none
    acme.store_output(watched, 0, {"sha256": "b" * 64}, now_ms=NOW + 80)
    acme.finish(watched, "completed", now_ms=NOW + 90)  # by the watcher's own generation: the entry goes
    assert acme.watched() == {} and acme.redis.hget(fleet, "busy:sim") == "0"


def test_a_collect_claim_books_the_ended_prompts_cost_once_and_only_for_the_current_operation(acme: Store) -> None:
    admit(acme, outputs=2, ceiling=60)
    worker = claim(acme, op="op-1")
    acme.mark_submit(worker, epoch="e", lease_ms=1000, now_ms=NOW + 10)
    acme.await_provider(worker, lease_ms=1000, now_ms=NOW + 20)
    assert acme.watch_entry(worker.job_id)["op"] == "op-1"
    stale = acme.collect_claim(worker.job_id, worker="w2", lease_ms=1000, charge=("op-0", 20, ""), now_ms=NOW + 30)
    assert stale is not None and stale.charged is False  # another operation's cost: nothing booked
    assert acme.job(worker.job_id)["charged"] == "0"
    acme.await_provider(stale.claim, lease_ms=1000, now_ms=NOW + 40)  # back to the watcher
    taken = acme.collect_claim(worker.job_id, worker="w2", lease_ms=1000, charge=("op-1", 20, ""), now_ms=NOW + 50)
    assert taken.charged is True and acme.watch_entry(worker.job_id) is None
    job = acme.job(worker.job_id)
    assert (job["charged"], job["reserved"], job["attempt_charged"]) == ("20", "40", "1")
    assert acme.charge(taken.claim, 20) == 0  # once per attempt
    assert acme.ledger("acme") == {"allowance": 100, "reserved": 60, "uncertain": 0, "settled": 0, "available": 40}


def test_a_cancel_before_or_after_the_hand_over_is_on_the_watch_entry(acme: Store) -> None:
    admit(acme)
    worker = claim(acme)
    acme.mark_submit(worker, epoch="e", lease_ms=1000, now_ms=NOW + 10)
    assert acme.cancel(worker.job_id, now_ms=NOW + 15)[0] == "running"  # the prompt is on its way
    acme.await_provider(worker, lease_ms=1000, now_ms=NOW + 20)
    assert acme.watch_entry(worker.job_id)["cancel"] == 1
    admit(acme, key="k2", job_id="acme.00000000000000000002")
    other = claim(acme, job_id="acme.00000000000000000002")
    acme.mark_submit(other, epoch="e", lease_ms=1000, now_ms=NOW + 30)
    acme.await_provider(other, lease_ms=1000, now_ms=NOW + 40)
    assert "cancel" not in acme.watch_entry(other.job_id)
    assert acme.cancel(other.job_id, now_ms=NOW + 50)[0] == "running"
    assert acme.watch_entry(other.job_id)["cancel"] == 1


@pytest.mark.parametrize("retention_ms", [None, 60_000])
def test_a_finished_job_wakes_its_tenant_when_it_is_due_for_purging(acme: Store, retention_ms) -> None:
    """With the retention known (every process's store has it), finishing a job wakes its tenant for
    the sweeper only when the job is due for purging; without it, at once (a sweeper pass then)."""
    store = Store(acme.redis, acme.scripts, retention_ms=retention_ms)
    admit(store)
    held = claim(store)  # its lease expiry, NOW + 1000, is the tenant's next due work
    store.store_output(held, 0, {"sha256": "a" * 64, "bytes": 1, "content_type": "image/png"}, now_ms=NOW + 40)
    store.finish(held, "completed", now_ms=NOW + 50)
    woken = store.redis.zscore(TenantKeys("acme").shard.wake, "acme")
    assert woken == (NOW + 50 if retention_ms is None else NOW + 1000)


@pytest.mark.parametrize("charged_before_crash", [False, True])
def test_lease_expiry_after_submission_holds_the_attempt_as_uncertain(acme: Store, charged_before_crash) -> None:
    admit(acme, outputs=2, ceiling=60)
    held = claim(acme)
    acme.mark_submit(held, now_ms=NOW, epoch="boot-1", lease_ms=1000)
    if charged_before_crash:  # the provider had reported its outputs: the cost is known
        acme.charge(held, 20)
    assert acme.begin_reconcile(held.job_id, now_ms=NOW + 2000, reason="lease_expired")
    job = acme.job(held.job_id)
    held_units = 0 if charged_before_crash else 20
    assert (job["state"], job["uncertain"]) == ("reconciling", str(held_units))
    assert acme.ledger("acme") == {"allowance": 100, "reserved": 60 - held_units, "uncertain": held_units,
                                   "settled": 0, "available": 40}
    rec = acme.claim_reconcile(held.job_id, worker="r", now_ms=NOW + 2001, lease_ms=1000)
    assert (rec.submitted, rec.epoch) == (True, "boot-1")
    assert acme.resolve_uncertain(rec.claim, executed=True) == held_units
    for index in (0, 1):
        acme.store_output(rec.claim, index, {"sha256": str(index) * 64}, now_ms=NOW + 2002)
    assert acme.redis.zscore(TenantKeys("acme").reconcile, held.job_id) == NOW + 3001  # while its lease lives
    acme.finish(rec.claim, "completed", now_ms=NOW + 2003)
    assert acme.redis.zcard(TenantKeys("acme").reconcile) == 0  # a finished reconciliation leaves the index
    assert acme.ledger("acme") == {"allowance": 100, "reserved": 0, "uncertain": 0, "settled": 20, "available": 80}
