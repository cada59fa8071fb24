"""What admitting a batch costs, against the same jobs posted one by one (docs/performance.md "Batches").

For 1, 100 and 1,000 jobs: one ``POST /v1/batches`` and as many ``POST /v1/jobs``, in process
(falcon's TestClient, reckon's Redis broker) over a private redis-server with ops/redis.conf. Each
reports the round trips to Redis (state and broker: one per command sent alone, one per pipeline),
the commands (``INFO commandstats``, both databases), Redis's CPU and the wall time, the median of
``--rounds`` runs.

    PYTHONPATH=. .venv/bin/python ops/bench/batches.py [--sizes 1,100,1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import redis
from falcon import testing

from api.app import create_app
from ops.bench.benchlib import ROOT, calls, private_store, redis_cpu
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.tenants import create_key, create_tenant
from pipeline.work.broker import Publisher
from pipeline.work.waking import WakingRedisBroker


class Counting(redis.Connection):
    """A connection that counts what it sends: one command, or one pipeline, a round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counting.sent += 1
        super().send_packed_command(command, check_health)


def body(seed: int) -> dict[str, Any]:
    return {"kind": "image", "outputs": 1, "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": seed}}}}


def measure(client: testing.TestClient, probe: Any, api_key: str, size: int, batch: bool, run: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {api_key}"}
    client.simulate_get("/v1/usage", headers=headers)  # the key is cached: not counted
    before_calls, before_cpu, before_sent = calls(probe), redis_cpu(probe), Counting.sent
    started = time.perf_counter()
    if batch:
        resp = client.simulate_post("/v1/batches", json={"jobs": [body(i) for i in range(size)]},
                                    headers=headers | {"Idempotency-Key": run})
        assert resp.status_code == 202 and all("job" in item for item in resp.json["items"]), resp.text[:500]
    else:
        for i in range(size):
            resp = client.simulate_post("/v1/jobs", json=body(i), headers=headers | {"Idempotency-Key": f"{run}.{i}"})
            assert resp.status_code == 202, resp.text[:500]
    seconds = time.perf_counter() - started
    sent = Counting.sent - before_sent
    after = calls(probe)
    commands = sum(after.values()) - sum(before_calls.values()) - (after.get("info", 0) - before_calls.get("info", 0))
    return {"round_trips": sent, "commands": commands, "redis_us": (redis_cpu(probe) - before_cpu) * 1e6,
            "ms": seconds * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with private_store(ROOT / "ops" / "redis.conf") as plain:
        port = plain.redis.connection_pool.connection_kwargs["port"]
        url = f"redis://127.0.0.1:{port}"
        settings = dataclasses.replace(Settings.from_env(), redis_url=url + "/0", broker_url=url + "/1",
                                       providers="sim=http://127.0.0.1:9;cap=1000",
                                       queue_cap_interactive=10**7, queue_cap_batch=10**7)
        state = redis.Redis(connection_pool=redis.ConnectionPool(
            host="127.0.0.1", port=port, db=0, decode_responses=True, connection_class=Counting))
        broker = WakingRedisBroker(client=redis.Redis(connection_pool=redis.ConnectionPool(
            host="127.0.0.1", port=port, db=1, connection_class=Counting)), namespace="dramatiq")
        store = Store(state)
        client = testing.TestClient(create_app(settings, store=store, publish=Publisher(broker)))
        probe = plain.redis
        print(f"{'jobs':>6} {'as':>6} {'round trips':>12} {'commands':>9} {'Redis us':>10} {'ms':>9}")
        for size in map(int, args.sizes.split(",")):
            for batch in (True, False):
                runs = []
                for r in range(args.rounds):
                    tenant = f"t{size}{'b' if batch else 'j'}{r}"
                    create_tenant(probe, tenant, 10**9)
                    runs.append(measure(client, probe, create_key(probe, tenant), size, batch, f"run-{tenant}"))
                median = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
                print(f"{size:>6} {'batch' if batch else 'alone':>6} {median['round_trips']:>12.0f} "
                      f"{median['commands']:>9.0f} {median['redis_us']:>10.0f} {median['ms']:>9.1f}")


if __name__ == "__main__":
    main()
