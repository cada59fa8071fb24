"""Fair dispatch across shards as deployed (docs/fleet.md "Fair dispatch across shards"): the whole stack
(gunicorn, a Dramatiq worker, the watcher, the sweeper) with ``RECKON_SHARDS`` set, one simulated server
of cap 1, jobs posted over HTTP; a tenant alone in its shard is served in turn with another shard's
backlog, not after it. With cap 1 the server runs one prompt at a time: the order jobs complete in is the
order they were dispatched in."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until
from tests.faults.conftest import Stack
from tests.faults.test_crashes import finished

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "priority": "batch"}


@pytest.mark.parametrize(("shards", "big", "small", "count", "pause"), [
    (4, "big", "small", 30, 0.0),  # small posts 5 right after big's 30
    (2, "acme", "wayne", 20, 1.0),  # wayne posts 1 a second after acme's 20 (about 10 still queued then)
])
def test_a_tenant_alone_in_its_shard_is_served_in_turn_with_another_shards_backlog(
        redis_client, tmp_path: Path, shards: int, big: str, small: str, count: int, pause: float) -> None:
    """Of the big tenant's jobs, those completed after the small tenant posted and before its last: the
    one running then, then one before each of small's (the shards alternate), and at most two more (one
    that takes the slot while small's first post is admitted, and a slot freed while small's first job
    was between its slot take and its park). 40 runs: 4 to 6 (4 shards), 0 to 3 (2 shards)."""
    keys.use_shards(shards)  # this process reads the jobs where the stack writes them
    stack = Stack(tmp_path, RECKON_SHARDS=str(shards))
    stack.env["RECKON_PROVIDERS"] = f"gpu=http://127.0.0.1:{stack.sim_port};cap=1"
    try:
        store = Store(redis_client, shards=shards)
        assert keys.TenantKeys(big).shard != keys.TenantKeys(small).shard
        auth = {}
        for tenant in (big, small):
            create_tenant(redis_client, tenant, 10**6)
            auth[tenant] = {"Authorization": f"Bearer {create_key(redis_client, tenant)}"}
        stack.start_provider(delay=0.15)
        stack.start_web()
        stack.start_worker()
        stack.start_sweeper()
        owner: dict[str, str] = {}

        def post(tenant: str, n: int) -> None:
            status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth[tenant],
                                           **{"Idempotency-Key": f"{tenant}-{n}"})
            assert status == 202
            owner[headers["location"].rsplit("/", 1)[1]] = tenant

        for n in range(count):
            post(big, n)
        time.sleep(pause)
        small_at, smalls = store.server_ms(), 5 if small == "small" else 1
        for n in range(smalls):
            post(small, n)
        wait_until(lambda: all(finished(store, job_id) for job_id in owner), timeout=120, interval=0.2)
        jobs = {job_id: store.job(job_id) for job_id in owner}
        assert {job["state"] for job in jobs.values()} == {"completed"}
        order = sorted(owner, key=lambda job_id: int(jobs[job_id]["updated_at"]))
        last = max(i for i, job_id in enumerate(order) if owner[job_id] == small)
        ahead = [job_id for job_id in order[:last] if owner[job_id] == big]
        after_small = [job_id for job_id in ahead if int(jobs[job_id]["updated_at"]) > small_at]
        print(f"{shards} shards: {len(ahead)} of {big}'s jobs completed before {small}'s last, "
              f"{len(after_small)} of them after {small} posted")
        assert len(after_small) <= smalls + 3, [owner[job_id] for job_id in order]
    finally:
        stack.stop(graceful=False)
        keys.use_shards(1)
