"""The slot life of issue 33 attacked with every Procfile process (docs/fleet.md "The slot is the GPU"):
one simulated server at cap 1, watched at its own ``/queue`` and in Redis (``busy:<server>``) while the
slot frees at each prompt's end. The server restarts after an end was heard and before its collect (the
watcher stopped before it, no worker runs: the watcher has called and sent the next job itself); a parked job is cancelled; the
server is paused while a prompt runs. The cap holds at the server and in Redis, busy never goes below
the prompts at the server nor negative, every job ends, and every slot is given back."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator
from urllib.request import urlopen

import orjson
import pytest

from ops.soak import soak_check
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import free_port, wait_until
from tests.faults.conftest import BIN, Stack
from tests.faults.test_crashes import BODY

SERVER = "s1"
FINAL = ("completed", "failed", "cancelled", "needs_review")


class Watch:
    """Polls the server's /queue and the shard's ``busy:<server>``: the most prompts it held at once,
    and each reading where Redis counted fewer slots taken than prompts at the server, or a negative."""

    def __init__(self, port: int, store: Store) -> None:
        self.port, self.store = port, store
        self.most, self.busiest = 0, 0
        self.under: list[tuple[int, list[str]]] = []  # (busy, prompts at the server) each time busy < prompts
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def prompts(self) -> list[str]:
        with urlopen(f"http://127.0.0.1:{self.port}/queue", timeout=5) as resp:
            queue = orjson.loads(resp.read())
        return [item[1] for item in queue["queue_running"] + queue["queue_pending"]]

    def busy(self) -> int:
        """The server's slots taken: every shard's ``busy:<server>`` summed, and with shards the fewer of
        that and its slot key's members (each must cover the prompts at the server)."""
        counts = [int(self.store.redis.hget(shard.fleet, f"busy:{SERVER}") or 0) for shard in keys.shards()]
        if min(counts) < 0:
            return min(counts)
        if keys.shard_count() > 1:
            return min(sum(counts), self.store.redis.zcard(keys.server_slots(SERVER)))
        return sum(counts)

    def _run(self) -> None:
        while not self.stop.is_set():
            before = self.busy()  # read around the queue: a slot taken is taken before its prompt is sent
            prompts = self.prompts()
            after = self.busy()
            self.most, self.busiest = max(self.most, len(prompts)), max(self.busiest, before, after)
            if min(before, after) < 0 or max(before, after) < len(prompts):
                self.under.append((max(before, after), prompts))
            time.sleep(0.003)


@pytest.fixture
def shards(request: pytest.FixtureRequest) -> Iterator[int]:
    """One shard, or the count a test names (``indirect``): the stack's RECKON_SHARDS and this process's keys."""
    count = getattr(request, "param", 1)
    keys.use_shards(count)
    yield count
    keys.use_shards(1)


@pytest.fixture
def slot_stack(redis_client, store: Store, shards: int, tmp_path: Path) -> Iterator[tuple[Stack, Watch, dict[str, str]]]:
    port = free_port()
    stack = Stack(tmp_path, RECKON_PROVIDERS=f"{SERVER}=http://127.0.0.1:{port};cap=1", RECKON_SHARDS=str(shards))
    stack.sim_port = port  # sim_post / charges talk to it
    watch = Watch(port, store)
    create_tenant(redis_client, "acme", 10**6)
    auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
    try:
        stack.start_provider(delay=1.5)
        watch.thread.start()
        yield stack, watch, auth
    finally:
        watch.stop.set()
        if watch.thread.is_alive():
            watch.thread.join()
        stack.stop()


def post(stack: Stack, auth: dict[str, str], key: str) -> str:
    status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth, **{"Idempotency-Key": key})
    assert status == 202
    return headers["location"].rsplit("/", 1)[1]


def state(store: Store, job_id: str) -> str:
    return (store.job(job_id) or {}).get("state", "")


def parked(store: Store, job_id: str) -> bool:
    return store.redis.zscore(keys.JobKeys(job_id).shard.parked, job_id) is not None


def at_server(watch: Watch, store: Store, job_id: str) -> bool:
    op = (store.job(job_id) or {}).get("operation_id")
    return bool(op) and op in watch.prompts()


@pytest.mark.parametrize("shards", [1, 2], indirect=True)
def test_a_restart_after_the_end_was_heard_and_before_the_collect_keeps_the_cap_and_ends_every_job(
        slot_stack, store: Store) -> None:
    stack, watch, auth = slot_stack
    stack.start_web()
    # no sweeper yet: its pass may call the parked job first, through the broker (no worker): not this case
    stack.start_worker(watcher=False)
    stack.start_watcher(pause_at="before_collect")  # it collects nothing: it stops each collect before it begins
    first = post(stack, auth, "a")
    wait_until(lambda: at_server(watch, store, first), timeout=20)
    second, third = post(stack, auth, "b"), post(stack, auth, "c")
    wait_until(lambda: parked(store, second) and parked(store, third), timeout=10)
    stack.kill("worker")  # idle: the watcher alone frees and sends
    assert state(store, first) == "running" and at_server(watch, store, first)  # not ended yet (1.5 s)
    # the first ends: its slot frees at once and the watcher sends the next parked job itself
    wait_until(lambda: at_server(watch, store, second), timeout=20)
    assert state(store, first) == "running"  # ended at the server, not collected (stopped before it)
    assert watch.busy() == 1
    stack.sim_post("/sim/restart", {})  # the first's history and the second's prompt are lost
    stack.kill("watcher")  # stopped at the first's collect; a watcher that collects takes over
    stack.start_watcher()
    stack.start_worker(watcher=False)
    stack.start_sweeper()  # reconciles what the restart lost
    wait_until(lambda: all(state(store, j) in FINAL for j in (first, second, third)), timeout=90, interval=0.1)
    wait_until(lambda: watch.busy() == 0 and not watch.prompts(), timeout=20)
    watch.stop.set()
    watch.thread.join()
    assert watch.most == 1 and watch.busiest == 1, (watch.most, watch.busiest)
    assert watch.under == [], watch.under[:3]
    # what the restart lost goes to review, its cost held (docs/fleet.md: no epoch to compare); the third ran
    assert [state(store, j) for j in (first, second, third)] == ["needs_review", "needs_review", "completed"]
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    assert (ledger["uncertain"], ledger["settled"]) == (40, 20), ledger
    assert soak_check.slots_left(store.redis) == []  # the reviews kept no slot: the prompts were gone


def test_a_cancelled_parked_job_and_a_paused_server_get_nothing_from_a_freed_slot(slot_stack, store: Store) -> None:
    stack, watch, auth = slot_stack
    stack.start_web()
    stack.start_sweeper()
    stack.start_worker()
    first = post(stack, auth, "a")
    wait_until(lambda: at_server(watch, store, first), timeout=20)
    second, third = post(stack, auth, "b"), post(stack, auth, "c")
    wait_until(lambda: parked(store, second) and parked(store, third), timeout=10)
    assert stack.api("POST", f"/v1/jobs/{second}/cancel", **auth)[0] in (200, 202)
    assert store.block_provider(SERVER, "dispatch_paused")
    wait_until(lambda: state(store, first) == "completed", timeout=20)
    time.sleep(1.0)  # the freed slot's call, and the sweeper's passes (every 0.2 s), had their turn
    assert state(store, second) == "cancelled"
    assert state(store, third) == "queued"  # paused: nothing sent
    assert watch.prompts() == [] and watch.busy() == 0
    assert not (store.job(second) or {}).get("operation_id")  # the cancelled one never left reckon
    assert store.clear_provider(SERVER, ["dispatch_paused"])
    wait_until(lambda: state(store, third) == "completed", timeout=20)
    assert state(store, second) == "cancelled" and not (store.job(second) or {}).get("operation_id")
    watch.stop.set()
    watch.thread.join()
    assert watch.most == 1 and watch.under == [], (watch.most, watch.under[:3])
    assert len(stack.charges()["charges"]) == 2  # the first and the third ran, the cancelled one never


@pytest.mark.parametrize("point", ["before_claim", "after_submit"])
def test_a_watcher_killed_while_it_sends_a_called_job_loses_nothing(slot_stack, store: Store, point: str) -> None:
    """The watcher runs the job called to the slot it freed (pipeline/work/dispatch.py LocalDispatch); killed
    there, before the claim (the call lapses and the sweeper's pass calls the job again, to a worker) or
    after the prompt was sent (its lease lapses and it is reconciled), the job still runs once."""
    stack, watch, auth = slot_stack
    stack.start_web()
    stack.start_sweeper()
    stack.start_worker(watcher=False)
    stack.start("watcher", str(BIN / "python"), "-m", "pipeline.work.watcher", pause_at=point)
    first = post(stack, auth, "a")
    wait_until(lambda: at_server(watch, store, first), timeout=20)
    second = post(stack, auth, "b")
    wait_until(lambda: parked(store, second), timeout=10)
    stack.kill_when_paused("watcher", timeout=30)  # the first ended; the watcher was sending the second
    stack.pause_file("watcher").unlink()
    stack.start_watcher()
    wait_until(lambda: state(store, first) in FINAL and state(store, second) in FINAL, timeout=60, interval=0.1)
    wait_until(lambda: watch.busy() == 0 and not watch.prompts(), timeout=20)
    watch.stop.set()
    watch.thread.join()
    assert [state(store, j) for j in (first, second)] == ["completed", "completed"]
    assert watch.most == 1 and watch.under == [], (watch.most, watch.under[:3])
    assert len(stack.charges()["charges"]) == 2  # each ran once
    ledger = store.ledger("acme")
    assert ledger["allowance"] == ledger["available"] + ledger["reserved"] + ledger["uncertain"] + ledger["settled"]
    assert (ledger["reserved"], ledger["uncertain"], ledger["settled"]) == (0, 0, 40), ledger


def test_the_soak_finds_a_slot_left_taken_at_rest(store: Store) -> None:
    """ops/soak/soak_check.py ``slots_left``: at rest a server's count equals the slots reviews keep there."""
    fleet = keys.ShardKeys(0).fleet
    store.redis.hset(fleet, mapping={"busy:s1": 1, "busy:s2": 0})
    assert soak_check.slots_left(store.redis) == [{"shard": 0, "server": "s1", "busy": 1, "kept": 0}]
    store.redis.hset(fleet, "k:j1/op1", orjson.dumps({"server": "s1", "since": 0}))
    assert soak_check.slots_left(store.redis) == []
    store.redis.hset(fleet, "busy:s2", -1)  # given back twice
    assert soak_check.slots_left(store.redis) == [{"shard": 0, "server": "s2", "busy": -1, "kept": 0}]


@pytest.mark.parametrize("shards", [1, 2], indirect=True)
def test_an_interrupt_at_max_seconds_and_a_cancel_of_the_running_prompt_give_the_slot_back_once(
        slot_stack, store: Store) -> None:
    """Both prompts end interrupted at the server: the end gives the slot back, the collect's finish nothing."""
    stack, watch, auth = slot_stack
    stack.start_web()
    stack.start_sweeper()
    stack.start_worker()
    status, headers, _ = stack.api("POST", "/v1/jobs", {**BODY, "max_seconds": 1}, **auth, **{"Idempotency-Key": "a"})
    assert status == 202
    limited = headers["location"].rsplit("/", 1)[1]
    cancelled, last = post(stack, auth, "b"), post(stack, auth, "c")
    wait_until(lambda: at_server(watch, store, cancelled), timeout=30)  # the first was interrupted at 1 s
    assert stack.api("POST", f"/v1/jobs/{cancelled}/cancel", **auth)[0] in (200, 202)
    wait_until(lambda: all(state(store, j) in FINAL for j in (limited, cancelled, last)), timeout=60, interval=0.1)
    wait_until(lambda: watch.busy() == 0 and not watch.prompts(), timeout=20)
    watch.stop.set()
    watch.thread.join()
    assert [state(store, j) for j in (limited, cancelled, last)] == ["failed", "cancelled", "completed"]
    assert store.job(limited)["error_reason"] == "max_seconds_exceeded"
    assert watch.most == 1 and watch.busiest == 1 and watch.under == [], (watch.most, watch.busiest, watch.under[:3])
    assert soak_check.slots_left(store.redis) == []
