"""What a job's uploaded inputs add to its attempt (pipeline/work/staging.py), measured: one worker
thread runs ``--jobs`` one-output jobs on a simulated ComfyUI over loopback HTTP, each through the
real claim, mark, submit, wait and finish, in three kinds: no input; one input of ``--bytes`` the
server already has (the check only); one new input of that size each (the check, the blob read and
the upload). Prints, per job, the Redis commands (``INFO commandstats``, the measuring ``info``
left out), the HTTP requests the worker sent by method, and the milliseconds of ``Executor.run``
(median); then what each kind adds to the first, and the median ms of the check (``HEAD /view``) and
of the upload (``POST /upload/image``) of one input alone, ``--jobs`` times each.

    PYTHONPATH=. .venv/bin/python ops/bench/staging.py [--jobs 50] [--bytes 1048576]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

from ops.bench.benchlib import calls, private_store
from pipeline.blobs.local import BlobStore
from pipeline.fleet import Server
from pipeline.inputs import name_for
from pipeline.providers import sim as simulated
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport, Response
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work.executor import Executor


class Counted(HttpTransport):
    """The real transport, counting the requests it sends by method."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.sent: Counter[str] = Counter()

    def request(self, method: str, path: str, body: bytes | None = None, **options: Any) -> Response:
        self.sent[method] += 1
        return super().request(method, path, body, **options)


def graph(n: int, name: str | None) -> dict:
    nodes: dict = {"9": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": f"b{n}"}}}
    nodes["1"] = ({"class_type": "LoadImage", "inputs": {"image": name}} if name
                  else {"class_type": "EmptyImage", "inputs": {"color": n}})
    return nodes


def kind(store: Store, jobs: int, size: int, inputs: str) -> tuple[float, dict[str, float], float]:
    """Commands a job, requests a job by method, median ms of a run, for one kind of job."""
    store.redis.flushall()
    server = simulated.start()
    transport = Counted(server.url)
    with tempfile.TemporaryDirectory() as directory:
        settings = dataclasses.replace(Settings.from_env(), providers=f"sim={server.url};cap=100", blob_dir=directory,
                                       watch=False, poll_interval_seconds=0.001, submit_settle_seconds=0.0)
        blobs = BlobStore(directory)
        executor = Executor(store, Fleet([Server("sim", server.url, 100)],
                                         lambda s: ComfyUI(transport, price_per_output=10)), blobs, settings)
        create_tenant(store.redis, "bench", 10**12)
        admitter = Admitter(store, lambda job_id, priority: None, settings)
        shared = name_for(blobs.put(os.urandom(size)), "image/png")
        if inputs == "held":
            server.sim.inputs[shared] = blobs.read(shared[7:71])
        names = [None if inputs == "none" else shared if inputs == "held"
                 else name_for(blobs.put(os.urandom(size)), "image/png") for _ in range(jobs)]
        ids = [admitter.submit("bench", f"k{n}", {"kind": "image", "outputs": 1, "workflow": graph(n, name)}).job_id
               for n, name in enumerate(names)]
        transport.sent.clear()
        before, millis = calls(store.redis), []
        for job_id in ids:
            started = time.perf_counter()
            assert executor.run(job_id), job_id
            millis.append((time.perf_counter() - started) * 1000)
        after = calls(store.redis)
    server.close()
    assert all(store.job(job_id)["state"] == "completed" for job_id in ids)
    commands = sum(after.values()) - sum(before.values()) - (after.get("info", 0) - before.get("info", 0))
    return commands / jobs, {m: n / jobs for m, n in sorted(transport.sent.items())}, statistics.median(millis)


def alone(jobs: int, size: int) -> tuple[float, float]:
    """Median ms of one input's check, and of its upload (with ``overwrite``), on loopback."""
    server = simulated.start()
    adapter = ComfyUI(HttpTransport(server.url), price_per_output=10)
    data = os.urandom(size)
    adapter.upload_input("bench.png", data)
    figures = []
    for step in (lambda: adapter.input_size("bench.png"), lambda: adapter.upload_input("bench.png", data,
                                                                                          overwrite=True)):
        millis = []
        for _ in range(jobs):
            started = time.perf_counter()
            step()
            millis.append((time.perf_counter() - started) * 1000)
        figures.append(statistics.median(millis))
    server.close()
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--bytes", type=int, default=1 << 20, help="size of each input")
    args = parser.parse_args()
    with private_store() as store:
        figures = {inputs: kind(store, args.jobs, args.bytes, inputs) for inputs in ("none", "held", "new")}
    base_commands, _, base_ms = figures["none"]
    for inputs, (commands, sent, ms) in figures.items():
        requests = ", ".join(f"{method} {n:.1f}" for method, n in sent.items())
        print(f"{inputs:>4} input: {commands:.1f} Redis commands, HTTP {requests}, {ms:.2f} ms a job "
              f"(+{commands - base_commands:.1f} commands, +{ms - base_ms:.2f} ms)")
    check, upload = alone(args.jobs, args.bytes)
    print(f"one input alone: check {check:.2f} ms, upload of {args.bytes} bytes {upload:.2f} ms")


if __name__ == "__main__":
    main()
