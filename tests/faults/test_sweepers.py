"""Many sweepers with real processes: two ``python -m pipeline.work.sweeper`` against one redis-server
and many tenants' due retries. Each due step happens once and both sweepers do some of it; a
sweeper killed in the middle of a pass leaves its tenants to the other when their hold ends.

The due work is a retry (retry_wait -> queued: one ``reckon.state`` line in the sweeper that
promoted it), then the outbox entry the promotion leaves (one broker message, from the sweeper
that published it). Nothing else falls due: the redelivery window is longer than the test.
"""

from __future__ import annotations

import ast
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from pipeline.state import keys
from pipeline.state.keys import TenantKeys
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.sweeper import TAKE_BATCH
from tests.conftest import REDIS_PORT, wait_until
from tests.faults.conftest import BIN
from tests.faults.test_json_logs import parsed

BODY = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1}
#: Longer than any test here: a promoted job is published once, by the outbox, never redelivered.
WINDOW = {"RECKON_OUTBOX_GRACE_SECONDS": "120"}


def retries(store, settings, tenants: list[str], delay_ms: Callable[[int], int]) -> dict[str, str]:
    """One job per tenant, claimed and sent to retry_wait for ``delay_ms(i)`` (the i-th tenant);
    job id -> tenant. Admitted without a broker message: the sweepers send the only one."""
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    jobs = {}
    for i, tenant in enumerate(tenants):
        create_tenant(store.redis, tenant, 1_000)
        job_id = admitter.submit(tenant, "retry-1", BODY).job_id
        claim = store.claim(job_id, worker="w", lease_ms=600_000, operation_id=f"op-{i}", servers={"sim": 1000})
        assert claim is not None
        store.retry(claim, delay_ms=delay_ms(i), error_class="transient")
        jobs[job_id] = tenant
    return jobs


def start_sweeper(stack, store, name: str, *, pause_at: str | None = None) -> str:
    """A sweeper process, waited for until its first pass; its name in the heartbeat hash (host/pid)."""
    stack.start(name, str(BIN / "python"), "-m", "pipeline.work.sweeper", pause_at=pause_at)
    me = f"{socket.gethostname()}/{stack.procs[name].pid}"
    wait_until(lambda: store.redis.hexists(keys.SWEEPER, f"at:{me}"), timeout=20)
    return me


def done(store, jobs: dict[str, str]) -> bool:
    """Every job queued again and published (its tenant's outbox empty)."""
    return (all(store.job(job_id)["state"] == "queued" for job_id in jobs)
            and all(store.redis.zcard(TenantKeys(tenant).outbox) == 0 for tenant in jobs.values()))


def promotions(path: Path) -> list[str]:
    """The jobs a sweeper moved out of retry_wait, from its ``reckon.state`` lines."""
    return [line["job"] for line in parsed(path)
            if line["logger"] == "reckon.state" and (line["from"], line["to"]) == ("retry_wait", "queued")]


def moved(path: Path) -> Counter[str]:
    """What a sweeper's passes moved, summed over its ``sweep: {...}`` lines."""
    total: Counter[str] = Counter()
    for line in parsed(path):
        if line["msg"].startswith("sweep: {"):
            total.update(ast.literal_eval(line["msg"].removeprefix("sweep: ")))
    return total


def messages() -> Counter[str]:
    """Job id -> how many broker messages carry it, over every Dramatiq queue (database 1)."""
    broker = redis.Redis(port=REDIS_PORT, db=1)
    try:  # lua/broker.lua: a waiting message is "<id> <message>" in its queue's list, a fetched one held by its worker
        waiting = [item.split(b" ", 1)[1] for key in broker.scan_iter("dramatiq:*", _type="list")
                   for item in broker.lrange(key, 0, -1)]
        fetched = [raw for key in broker.scan_iter("dramatiq:__held__.*") for raw in broker.hvals(key)]
        return Counter(orjson.loads(raw)["args"][0] for raw in waiting + fetched)
    finally:
        broker.close()


def events_after_retry(store, job_id: str) -> list[dict[str, Any]]:
    return [event for event in store.events(job_id) if event["from"] == "retry_wait"]


def test_two_sweepers_split_the_due_work_and_move_each_job_once(stack, redis_client, store, settings) -> None:
    stack.env |= WINDOW
    first, second = start_sweeper(stack, store, "first"), start_sweeper(stack, store, "second")
    tenants = [f"t{n:03d}" for n in range(120)]
    jobs = retries(store, settings, tenants, delay_ms=lambda i: 500 + 25 * i)  # one due every 25 ms, for 3 s
    wait_until(lambda: done(store, jobs), timeout=60)
    stack.stop()  # every line written
    by = {name: promotions(stack.logs / f"{name}.log") for name in ("first", "second")}
    assert Counter(by["first"] + by["second"]) == Counter(dict.fromkeys(jobs, 1))  # each job promoted once
    assert len(by["first"]) > 0 and len(by["second"]) > 0  # ...by either sweeper: both did some
    assert [[e["to"] for e in store.events(job_id)] for job_id in jobs] == [
        ["queued", "running", "retry_wait", "queued"]] * len(jobs)
    steps = {name: moved(stack.logs / f"{name}.log") for name in ("first", "second")}
    assert steps["first"] + steps["second"] == {"retries_promoted": 120, "republished": 120}
    assert steps["first"]["retries_promoted"] == len(by["first"])
    assert messages() == Counter(dict.fromkeys(jobs, 1))  # each published once, by one of them
    beat = store.redis.hgetall(keys.SWEEPER)
    assert set(beat) == {"at", "by", f"at:{first}", f"at:{second}"} and beat["by"] in (first, second)
    assert beat["at"] == max(beat[f"at:{first}"], beat[f"at:{second}"], key=int)


def test_a_sweeper_killed_mid_pass_leaves_its_tenants_to_the_other_when_the_hold_ends(
        stack, redis_client, store, settings, capsys) -> None:
    hold_ms = 3_000
    stack.env |= WINDOW | {"RECKON_SWEEP_HOLD_SECONDS": str(hold_ms / 1000)}
    tenants = [f"t{n:03d}" for n in range(40)]
    jobs = retries(store, settings, tenants, delay_ms=lambda i: 0)  # all due at once
    stack.start("dying", str(BIN / "python"), "-m", "pipeline.work.sweeper", pause_at="sweep_visited")
    wait_until(stack.pause_file("dying").exists, timeout=20)  # one tenant visited, its batch's 19 others held
    taken = [job_id for job_id in jobs if events_after_retry(store, job_id)]
    assert len(taken) == 1 and jobs[taken[0]] == "t000"  # due at once: taken in name order
    pass_ms = events_after_retry(store, taken[0])[0]["at"]  # the pass's clock: its take-due held until +hold
    survivor = start_sweeper(stack, store, "survivor")
    stack.kill("dying")  # SIGKILL while holding 19 tenants
    killed = time.monotonic()
    wait_until(lambda: done(store, jobs), timeout=hold_ms / 1000 + 30)
    after_kill = time.monotonic() - killed
    stack.stop()
    rest = [job_id for job_id in jobs if job_id not in taken]
    assert Counter(promotions(stack.logs / "survivor.log")) == Counter(rest)
    assert promotions(stack.logs / "dying.log") == taken
    assert [len(events_after_retry(store, job_id)) for job_id in jobs] == [1] * 40  # no job moved twice
    held = [job_id for job_id in rest if jobs[job_id] < f"t{TAKE_BATCH:03d}"]
    assert len(held) == TAKE_BATCH - 1
    moved_at = [events_after_retry(store, job_id)[0]["at"] for job_id in held]
    assert min(moved_at) >= pass_ms + hold_ms  # nobody touched a held tenant before its hold ended
    free_at = [events_after_retry(store, job_id)[0]["at"] for job_id in rest if job_id not in held]
    assert max(free_at) < pass_ms + hold_ms  # the tenants it had not taken yet went to the other at once
    assert moved(stack.logs / "survivor.log") == {"retries_promoted": 39, "republished": 40}
    assert messages() == Counter(dict.fromkeys(jobs, 1))
    assert store.redis.hget(keys.SWEEPER, "by") == survivor
    with capsys.disabled():
        print(f"\ntakeover: the held tenants moved {(max(moved_at) - pass_ms) / 1000:.2f} s after the dead "
              f"sweeper took them (hold {hold_ms / 1000:.0f} s); all due work done {after_kill:.2f} s after SIGKILL")


def test_a_sweeper_that_starts_drops_the_heartbeat_of_sweepers_silent_for_an_hour(stack, redis_client, store) -> None:
    now = store.server_ms()
    store.redis.hset(keys.SWEEPER, mapping={"at": now - 10_000, "by": "old/1", "at:old/1": now - 3_600_001,
                                            "at:recent/2": now - 3_599_000})
    me = start_sweeper(stack, store, "sweeper")
    beat = store.redis.hgetall(keys.SWEEPER)
    assert set(beat) == {"at", "by", f"at:{me}", "at:recent/2"} and beat["by"] == me
    stack.stop()
    assert [line["msg"] for line in parsed(stack.logs / "sweeper.log") if "heartbeat" in line["msg"]] == [
        "sweeper old/1 has not passed for an hour: dropped from the heartbeat"]
