"""Checkpoint affinity, measured: two simulated ComfyUI servers (cap 1 each) that take
``--load`` seconds to load a checkpoint other than the one in memory and ``--delay`` seconds per
prompt; ``--jobs`` jobs each naming one of two checkpoints at random (seeded), dispatched by the real claim and unpark
scripts (eight worker threads, as the Procfile's worker has, each waiting for its prompt), once with checkpoint affinity
(each job's ``ckpt``, as admission sets it) and once without (the field removed after admission).
Prints the model loads and the wall time of each run, and the ratio.

    PYTHONPATH=. .venv/bin/python ops/bench/affinity.py [--jobs 40] [--load 0.3] [--delay 0.05]
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import random
import tempfile
import threading
import time

from ops.bench.benchlib import private_store
from pipeline.blobs.local import BlobStore
from pipeline.fleet import Server
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor


def graph(checkpoint: str, n: int) -> dict:
    return {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
            "3": {"class_type": "KSampler", "inputs": {"seed": n, "model": ["1", 0]}},
            "9": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}}}


def run(store: Store, jobs: int, load: float, delay: float, affinity: bool) -> tuple[int, float]:
    """Model loads and seconds for ``jobs`` jobs through two servers."""
    store.redis.flushall()
    servers = {name: simulated.start(delay=delay, load_seconds=load) for name in ("a", "b")}
    fleet_spec = ",".join(f"{name}={server.url};cap=1" for name, server in servers.items())
    with tempfile.TemporaryDirectory() as blobs:
        settings = dataclasses.replace(Settings.from_env(), providers=fleet_spec, blob_dir=blobs, watch=False,
                                       poll_interval_seconds=0.01, submit_settle_seconds=0.0)
        fleet = Fleet([Server(n, s.url, 1) for n, s in servers.items()],
                      lambda s: ComfyUI(HttpTransport(s.url, timeout=10), price_per_output=10))
        executor = Executor(store, fleet, BlobStore(blobs), settings)
        create_tenant(store.redis, "bench", 10**9)
        admitter = Admitter(store, lambda job_id, priority: None, settings)
        pick = random.Random(7)
        ids = [admitter.submit("bench", f"k{n}", {"kind": "image", "outputs": 1, "priority": "batch",
                                                  "workflow": graph(pick.choice("xy") + ".safetensors", n)}).job_id
               for n in range(jobs)]
        if not affinity:
            for job_id in ids:
                store.redis.hdel(keys.JobKeys(job_id).record, "ckpt")
        todo: queue.Queue[str | None] = queue.Queue()
        for job_id in ids:
            todo.put(job_id)
        done = threading.Semaphore(0)

        def work() -> None:
            while (job_id := todo.get()) is not None:
                if executor.run(job_id):
                    done.release()
                for called in store.unpark(keys.ShardKeys(0), fleet.caps()):
                    todo.put(called)

        started = time.monotonic()
        threads = [threading.Thread(target=work) for _ in range(8)]  # as the Procfile's 2 x 4 worker threads
        for thread in threads:
            thread.start()
        for _ in ids:
            done.acquire()
        seconds = time.monotonic() - started
        for thread in threads:
            todo.put(None)
        for thread in threads:
            thread.join()
    loads = sum(server.sim.loads for server in servers.values())
    for server in servers.values():
        server.close()
    return loads, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--load", type=float, default=0.3, help="seconds a server takes to load another checkpoint")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds a prompt takes once loaded")
    args = parser.parse_args()
    with private_store() as store:
        figures = {mode: run(store, args.jobs, args.load, args.delay, mode == "affinity")
                   for mode in ("no affinity", "affinity")}
    for mode, (loads, seconds) in figures.items():
        print(f"{mode:>12}: {loads} checkpoint loads, {seconds:.2f} s for {args.jobs} jobs")
    (off_loads, off_s), (on_loads, on_s) = figures["no affinity"], figures["affinity"]
    print(f"affinity: {on_loads / max(1, off_loads):.2f} x the loads, {on_s / off_s:.2f} x the time")


if __name__ == "__main__":
    main()
