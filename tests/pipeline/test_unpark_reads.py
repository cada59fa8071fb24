"""What an unpark reads of the fleet hash for a freed slot (lua/_slots.lua `match_calls`): the promise of
each called job, and the placements of the parked jobs only as far as the matching goes, not the whole
head of the parked set read for it (an HMGET of 2 fields a job: about 60 µs of a 270 µs unpark at a
2,000-job backlog, docs/performance.md). Real admission, claim, finish and unpark scripts on a real
redis-server, whose SLOWLOG at threshold 0 logs each command a script calls, with its arguments."""

from __future__ import annotations

from pipeline.state import keys

CAPS = {"a": 1}
PARKED = 40  # more than the head an unpark reads (1 free slot + its look-ahead of 32)


def fleet_reads(redis_client, run):
    """The fields each HMGET of the shard's fleet hash asked for while ``run`` ran, and its result."""
    fleet = keys.ShardKeys(0).fleet
    before = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.slowlog_reset()
    try:
        result = run()
        log = redis_client.slowlog_get(10_000)
    finally:
        redis_client.config_set("slowlog-log-slower-than", before)
    reads = []
    for entry in reversed(log):  # oldest first; redis-py joins a command's words with spaces
        words = entry["command"].decode().split(" ")
        if words[:2] == ["HMGET", fleet]:
            reads.append(words[2:])
    return reads, result


def test_a_freed_slot_reads_the_placement_of_the_first_parked_jobs_only(store, admit) -> None:
    running = store.claim(admit("k0"), worker="w", lease_ms=60_000, operation_id="op0", servers=CAPS)
    parked = [admit(f"k{i}") for i in range(1, PARKED + 1)]
    for job_id in parked:
        assert store.claim(job_id, worker="w", lease_ms=60_000, operation_id=job_id, servers=CAPS) is None
    store.retry(running, delay_ms=60_000, error_class="test")  # the slot frees
    reads, called = fleet_reads(store.redis, lambda: store.unpark(keys.ShardKeys(0), CAPS))
    assert called == [parked[0]]
    fields = [field for read in reads for field in read]
    placements = [field for field in fields if field.startswith("p:")]
    assert placements == [f"p:{job_id}" for job_id in parked[:9]]  # 1 free slot + AFFINITY_WINDOW 8
    assert not [field for field in fields if field.startswith("c:")]  # no job was called before
    assert store.unpark(keys.ShardKeys(0), CAPS) == []  # the call holds its slot: nobody else is called for it
