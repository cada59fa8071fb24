#!/usr/bin/env python3
"""What uploaded inputs cost in Redis: commands and bytes per upload, and what a job naming inputs adds.

Run: ``.venv/bin/python ops/bench/inputs.py --jobs 1000 --inputs 3``.
Starts a private redis-server (ops/redis.conf, AOF off) on a free loopback port. Uploads ``--inputs`` inputs as
``POST /v1/inputs`` records them (the API's reads, then lua/input-put.lua), then admits ``--jobs`` jobs
through the real admission path twice: naming no input, then naming all of them; and prints Redis
commands (``INFO commandstats``, those a script calls included, FCALL itself left out) and bytes
(``MEMORY USAGE`` summed over every key, every element sampled) per upload and per job.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ops.bench.benchlib import private_store  # noqa: E402
from pipeline.inputs import name_for  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from pipeline.state.inputs import Input, InputStore  # noqa: E402
from pipeline.state.keys import TenantKeys  # noqa: E402
from pipeline.state.store import Store  # noqa: E402
from pipeline.state.submit import Admitter  # noqa: E402
from pipeline.state.tenants import create_tenant  # noqa: E402


def commands(store: Store, call: Callable[[], Any]) -> int:
    store.redis.config_resetstat()
    call()
    stats = store.redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_config|resetstat"))


def memory(store: Store) -> int:
    names = list(store.redis.scan_iter(count=1000))
    pipe = store.redis.pipeline(transaction=False)
    for name in names:
        pipe.memory_usage(name, samples=0)
    return sum(n or 0 for n in pipe.execute())


def admit_all(store: Store, admitter: Admitter, tag: str, jobs: int, names: list[str]) -> tuple[int, int]:
    """(commands, bytes) of ``jobs`` admissions whose workflow names ``names``."""
    nodes = {str(i): {"class_type": "LoadImage", "inputs": {"image": n}} for i, n in enumerate(names, 10)}
    before, total = memory(store), 0
    for n in range(jobs):
        workflow = {"1": {"class_type": "EmptyImage", "inputs": {"color": n}}, **nodes}
        body = {"kind": "image", "workflow": workflow, "outputs": 1}
        total += commands(store, lambda: admitter.submit("acme", f"{tag}-{n}", body))
    return total, memory(store) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--inputs", type=int, default=3)
    args = parser.parse_args()
    settings = dataclasses.replace(Settings.from_env(), providers="gpu=http://127.0.0.1:9;cap=1000",
                                   queue_cap_interactive=10**6)
    with private_store(ROOT / "ops/redis.conf") as store:
        create_tenant(store.redis, "acme", 10**12)
        stored = InputStore(store.redis, store.scripts)
        admitter = Admitter(store, lambda job_id, priority: None, settings)
        admit_all(store, admitter, "warm", 2, [])  # the scripts' first load and Redis's first keys, uncounted
        before, upload = memory(store), 0
        names = []
        for n in range(args.inputs):
            sha = hashlib.sha256(b"input %d" % n).hexdigest()
            item = Input(name_for(sha, "image/png"), sha, 1_000_000, "image/png")

            def put(item: Input = item) -> None:  # as api/inputs.py: is it new, the quota, then the step
                stored.get("acme", item.sha256)
                stored.held("acme", settings.input_quota_bytes)
                stored.put("acme", item, default_quota=settings.input_quota_bytes)

            upload += commands(store, put)
            names.append(item.name)
        uploaded = memory(store) - before
        plain = admit_all(store, admitter, "plain", args.jobs, [])
        named = admit_all(store, admitter, "named", args.jobs, names)
        held = store.redis.memory_usage(TenantKeys("acme").input_jobs(names[0].split("/")[1][:64]), samples=0)
    per = args.inputs
    print(f"upload: {upload / per:.1f} commands, {uploaded / per:.0f} bytes of Redis per input")
    print(f"admission without inputs: {plain[0] / args.jobs:.1f} commands, {plain[1] / args.jobs:.0f} bytes a job")
    print(f"admission naming {per}: {named[0] / args.jobs:.1f} commands, {named[1] / args.jobs:.0f} bytes a job: "
          f"{(named[0] - plain[0]) / args.jobs:.1f} commands and {(named[1] - plain[1]) / args.jobs:.0f} bytes more")
    print(f"an input's set of jobs: {held / args.jobs:.0f} bytes a job that named it (until a delete prunes it)")


if __name__ == "__main__":
    main()
