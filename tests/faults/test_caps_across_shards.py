"""A server's cap holds across shards (pipeline/state/slots.py): the whole stack on a real
three-primary Redis Cluster with RECKON_SHARDS=4, two simulated servers of cap 1 and cap 3 watched
at their own ``/queue``, 120 jobs from 40 tenants (so every shard claims), a worker killed between
taking a slot and claiming its job; no server ever holds more prompts than its cap, and no slot is
left taken."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.request import urlopen

import orjson
import pytest
import redis

from pipeline.state import keys
from pipeline.state.slots import GRACE_MS, KEEP_EVERY_MS
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from tests import cluster
from tests.conftest import REDIS_URL, free_port, wait_until
from tests.faults.conftest import BIN, Stack
from tests.faults.test_crashes import BODY, finished

TENANTS, JOBS = 40, 120  # three jobs a tenant: every shard claims, a backlog of over 100 behind 4 slots
CAPS = {"one": 1, "three": 3}


class Watch:
    """Polls each simulated server's /queue and keeps the most prompts it held at once."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports, self.most = ports, dict.fromkeys(ports, 0)
        self.stop = threading.Event()
        #: (server, the prompt ids it held) each time it held more than its cap.
        self.over: list[tuple[str, list[str]]] = []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.is_set():
            for name, port in self.ports.items():
                with urlopen(f"http://127.0.0.1:{port}/queue", timeout=5) as resp:
                    queue = orjson.loads(resp.read())
                self.most[name] = max(self.most[name], len(queue["queue_running"]) + len(queue["queue_pending"]))
                if len(queue["queue_running"]) + len(queue["queue_pending"]) > CAPS[name]:  # for the report
                    self.over.append((name, [item[1] for item in queue["queue_running"] + queue["queue_pending"]]))
            time.sleep(0.005)


def charged(port: int) -> int:
    with urlopen(f"http://127.0.0.1:{port}/sim/charges", timeout=5) as resp:
        return len(orjson.loads(resp.read())["charges"])


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_caps_hold_across_four_shards_on_a_cluster_and_a_killed_claim_leaks_no_slot(
        redis_cluster: cluster.Cluster, store: Store, shards: int, tmp_path: Path) -> None:
    assert shards == 4
    redis.Redis.from_url(REDIS_URL[:-1] + "1").flushdb()  # the broker's database, on the one server
    ports = {name: free_port() for name in CAPS}
    fleet = ",".join(f"{name}=http://127.0.0.1:{ports[name]};cap={cap}" for name, cap in CAPS.items())
    stack = Stack(tmp_path, RECKON_REDIS_CLUSTER=redis_cluster.spec, RECKON_SHARDS=str(shards),
                  RECKON_PROVIDERS=fleet, RECKON_LEASE_SECONDS="5")
    watch = Watch(ports)
    try:
        for name, port in ports.items():
            stack.start(f"sim-{name}", str(BIN / "python"), "-m", "pipeline.providers.sim", "--port", str(port),
                        "--delay", "0.2")
            wait_until(lambda port=port: Stack._up(f"http://127.0.0.1:{port}/queue"))
        tenants = [f"t{n:02d}" for n in range(TENANTS)]
        assert len({keys.TenantKeys(t).shard.n for t in tenants}) == shards  # every shard claims
        auth = {}
        for tenant in tenants:
            create_tenant(store.redis, tenant, 10**6)
            auth[tenant] = {"Authorization": f"Bearer {create_key(store.redis, tenant)}"}
        watch.thread.start()
        stack.start_web()
        stack.start_watcher()
        stack.start("doomed", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                    "--processes", "1", "--threads", "2", pause_at="after_slot_taken")
        jobs = []
        for n in range(JOBS):
            tenant = tenants[n % TENANTS]
            status, headers, _ = stack.api("POST", "/v1/jobs", BODY, **auth[tenant], **{"Idempotency-Key": f"k{n}"})
            assert status == 202
            jobs.append(headers["location"].rsplit("/", 1)[1])
        stack.kill_when_paused("doomed")  # a slot taken, its job not claimed: the slot's holder is gone
        killed_at = time.monotonic()
        leaked = {name: store.redis.zrange(keys.server_slots(name), 0, -1) for name in CAPS}
        assert sum(map(len, leaked.values())) >= 1
        # only the sweeper frees a slot nobody holds (none lapses): started once the leak is read, as posting
        # the jobs may outlast the grace on a loaded machine
        stack.start_sweeper()
        stack.start_worker(watcher=False)
        stack.start("worker2", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                    "--processes", "1", "--threads", "4")
        # the killed attempts' slots (members `<job id>/<operation id>`) are freed by the sweeper after the
        # grace, at its next keep (with room for a loaded machine: slots never lapse by age alone)
        wait_until(lambda: all(store.redis.zscore(keys.server_slots(name), attempt) is None
                               for name, held in leaked.items() for attempt in held),
                   timeout=(GRACE_MS + KEEP_EVERY_MS) / 1000 + 50)
        freed_at = time.monotonic() - killed_at
        wait_until(lambda: all(finished(store, job_id) for job_id in jobs), timeout=180, interval=0.2)
        assert {store.job(job_id)["state"] for job_id in jobs} == {"completed"}
        assert sum(charged(port) for port in ports.values()) == JOBS  # one execution each
        wait_until(lambda: all(store.redis.zcard(keys.server_slots(name)) == 0 for name in CAPS), timeout=10)
    finally:
        watch.stop.set()
        if watch.thread.is_alive():
            watch.thread.join()
        stack.stop(graceful=False)
    assert all(watch.most[name] <= cap for name, cap in CAPS.items()), (watch.most, watch.over[:3])
    assert watch.most["three"] > 1  # the servers were shared: prompts queued beside each other
    print(f"most prompts at once: {watch.most} (caps {CAPS}); slots of the killed claims {leaked} freed "
          f"{freed_at:.1f} s after the kill")
