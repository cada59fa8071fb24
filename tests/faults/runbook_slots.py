"""The runbook's commands for a slot a review kept (ops/RUNBOOK.md "Reviews"), run by
tests/faults/test_runbook.py against its live stack."""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.state import keys
from pipeline.state.store import Store


def kept_slots(rb: Any, store: Store, job_id: str) -> None:
    """A server removed for good while a review kept a slot there for job ``job_id``'s prompt: the fleet
    hash lists the kept slot; ``reckon provider forget SERVER`` gives it back, once. ``rb``: the test's
    runbook runner. The slot is written as ``keep_slot`` (lua/_slots.lua) writes it: a live review that
    keeps one needs a prompt outlasting RECKON_RECONCILE_MAX_SECONDS, which
    tests/pipeline/test_kept_slots.py drives with the executor's own reconciliation."""
    fleet, gone = keys.ShardKeys(0).fleet, "retired"
    slot = f"{job_id}/{store.job(job_id)['operation_id']}"
    store.redis.hset(fleet, f"k:{slot}", orjson.dumps({"server": gone, "since": store.server_ms()}))
    store.redis.hincrby(fleet, f"busy:{gone}", 1)
    assert f"k:{slot}" in rb.lines("redis-cli -p 6390 HKEYS reckon:{s0}:fleet")
    assert rb.json("reckon provider forget SERVER", SERVER=gone) == {"provider": gone, "freed": [slot]}
    assert store.redis.hget(fleet, f"busy:{gone}") == "0"
    assert [field for field in rb.lines("redis-cli -p 6390 HKEYS reckon:{s0}:fleet") if field.startswith("k:")] == []
    assert rb.json("reckon provider forget SERVER", SERVER=gone) == {"provider": gone, "freed": []}
