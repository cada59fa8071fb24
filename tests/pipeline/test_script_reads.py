"""What the scripts read of a hash on a job's path, where a read costs more than its command count shows:
an unpark for a freed slot reads the promise of each called job and the placements of the parked jobs only
as far as the matching goes (lua/_slots.lua `match_calls`), not the whole head of the parked set read
for it (an HMGET of 2 fields a job: about 60 µs of a 270 µs unpark at a 2,000-job backlog); an output's
record reads the 2 fields of the job record its fence needs (lua/store-output.lua), not the whole record
(HGETALL of about 35 fields into a Lua table: 7 µs against 1), and the lease renewal, the submit mark and
the hand-over read theirs in one HMGET. Real admission, claim, finish, unpark, store-output, heartbeat,
mark-submit and await scripts on a real redis-server, whose SLOWLOG at threshold 0 logs each command a script
calls, with its arguments (docs/performance.md "Redis CPU per step")."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest

from pipeline.errors import StaleLease
from pipeline.state import keys
from pipeline.state.keys import JobKeys

CAPS = {"a": 1}
PARKED = 40  # more than the head an unpark reads (1 free slot + its look-ahead of 32)


def logged(redis_client: Any, run: Callable[[], Any]) -> tuple[list[list[str]], Any]:
    """The commands Redis executed while ``run`` ran (a script's own commands included), oldest first,
    each as its words, and what ``run`` returned."""
    before = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.slowlog_reset()
    try:
        result = run()
        log = redis_client.slowlog_get(10_000)
    finally:
        redis_client.config_set("slowlog-log-slower-than", before)
    return [entry["command"].decode().split(" ") for entry in reversed(log)], result  # redis-py joins the words


def test_a_freed_slot_reads_the_placement_of_the_first_parked_jobs_only(store, admit) -> None:
    running = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=CAPS)
    parked = [admit(f"k{i}") for i in range(1, PARKED + 1)]
    for job_id in parked:
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=CAPS) is None
    store.retry(running, delay_ms=60_000, error_class="test")  # the slot frees
    commands, called = logged(store.redis, lambda: store.unpark(keys.ShardKeys(0), CAPS))
    assert called == [parked[0]]
    fleet = keys.ShardKeys(0).fleet
    fields = [field for words in commands if words[:2] == ["HMGET", fleet] for field in words[2:]]
    placements = [field for field in fields if field.startswith("p:")]
    assert placements == [f"p:{job_id}" for job_id in parked[:9]]  # 1 free slot + AFFINITY_WINDOW 8
    assert not [field for field in fields if field.startswith("c:")]  # no job was called before
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # the call holds its slot: nobody else is called for it


def test_an_output_record_reads_the_fence_of_the_job_record_only(store, admit) -> None:
    claim = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=CAPS)
    record = JobKeys(claim.job_id).record
    output = {"sha256": "0" * 64, "bytes": 10, "content_type": "image/png"}
    commands, added = logged(store.redis, lambda: store.store_output(claim, 0, output))
    assert added is True
    reads = [words[:1] + words[2:] for words in commands if len(words) > 1 and words[1] == record]
    assert reads == [["HMGET", "state", "lease_gen"], ["HSET", "updated_at", reads[-1][-1]]]
    with pytest.raises(StaleLease):  # the fence still holds: an older generation writes nothing
        store.store_output(dataclasses.replace(claim, generation=claim.generation - 1), 1, output)
    store.finish(claim, "completed")  # packed: its lease_gen is in `z`, its state ends it
    with pytest.raises(StaleLease):
        store.store_output(claim, 1, output)
    assert sorted(store.redis.hkeys(record)) == ["state", "z"]


def test_the_steps_between_claim_and_collect_read_the_job_record_in_one_hmget(store, admit) -> None:
    """The lease renewal, the submit mark and the hand-over to the watcher read the fields they use, each in
    one HMGET (the fields their fence, their step, `renew` and `wake` read), never the whole record, and
    never a field more in a second read."""
    claim = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=CAPS)
    record = JobKeys(claim.job_id).record

    def record_reads(run: Callable[[], Any]) -> list[str]:
        commands, _ = logged(store.redis, run)
        return [words[0] for words in commands if len(words) > 1 and words[1] == record]

    assert record_reads(lambda: store.heartbeat(claim, lease_ms=60_000)) == ["HMGET", "HSET"]
    assert record_reads(lambda: store.mark_submit(claim, epoch="e1", lease_ms=60_000)) == ["HMGET", "HSET"]
    assert record_reads(lambda: store.await_provider(claim, lease_ms=60_000)) == ["HMGET", "HSET"]
    job = store.redis.hgetall(record)
    assert (job["submitted"], job["submit_epoch"], job["lease_owner"]) == ("1", "e1", "watcher")
