"""The gap between two prompts on one server in a backlog, and where the machine's CPU went meanwhile
(issue 33: the GPU idles from one prompt's end to the next one's start).

One stack as ops/bench/busy.py's (``Deployed``: every Procfile process, simulated servers of ``delay``
seconds, cap ``cap``), one warm-up job, then ``jobs`` jobs posted over HTTP as busy.py posts them:

- **gaps**: for each server, its executions in order (``execution_start`` and end, the server's own
  timestamps from ``/history``); each gap is one prompt's end to the next one's start on that server, ms;
- **parts** (when the processes wrote a trace: lines ``<ms since the epoch> <event> <key> ...`` in the file
  ``RECKON_GAP_TRACE`` names, which the code writes only with ``git apply ops/bench/gaps_trace.patch``:
  the end ``heard`` by the watcher, the slot ``released``, the called job's dispatch ``thread`` started, it
  ``claimed``, its inputs ``staged``, its ``post`` sent): each gap cut at those points, where the next
  prompt was sent by the watcher's dispatch after the previous one's end was heard (else it counts as
  sent by another path: a worker, after the sweeper's unpark or a claim of its own);
- **cpu**: CPU seconds each kind of process used over the backlog (the simulated servers, redis-server,
  and each of reckon's processes), against the machine's cores over the same wall time.

Run: ``PYTHONPATH=. .venv/bin/python ops/bench/gaps.py --servers 2 --delay 0.25 --jobs 120``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import orjson

from ops.bench.benchlib import group_cpu, percentile, wait_for
from ops.bench.busy import CONCURRENCY, DEFAULT_OUTPUTS, DEFAULT_WORKFLOW_BYTES, executions, warmed
from ops.bench.deployed import Deployed, completed, post, workflow

#: The parts of a gap, each from the event before it (the first from the previous prompt's end).
PARTS = ("heard", "released", "thread", "claimed", "staged", "post", "start")
#: The trace's events (ops/bench/gaps_trace.patch writes them, and ``posted`` and ``called``, unread here).
EVENTS = PARTS[:-1]


def read_trace(path: Path) -> dict[str, dict[str, float]]:
    """event -> key -> ms; ``claimed`` lines (``<job id> <operation id>``) are keyed by the operation, and
    ``thread`` by the job (its last run before a claim is kept per claim below)."""
    events: dict[str, dict[str, float]] = defaultdict(dict)
    threads: dict[str, list[float]] = defaultdict(list)
    owner: dict[str, str] = {}
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        stamp, event, *key = line.split()
        if event not in EVENTS:
            continue
        if event == "thread":
            threads[key[0]].append(float(stamp))
        elif event == "claimed":
            if key[1] != "-":
                events["claimed"][key[1]] = float(stamp)
                owner[key[1]] = key[0]
        else:
            events[event].setdefault(key[0], float(stamp))
    for op, job_id in owner.items():  # the run of the job's thread that made this claim
        before = [t for t in threads.get(job_id, []) if t <= events["claimed"][op]]
        if before:
            events["thread"][op] = before[-1]
    return events


def gaps(spans: dict[str, tuple[int, int]], events: dict[str, dict[str, float]]) -> tuple[list[float], dict[str, list[float]]]:
    """One server's gaps (ms) and, for those the dispatch sent after the end was heard, their parts."""
    order = sorted(spans.items(), key=lambda item: item[1][0])
    whole: list[float] = []
    parts: dict[str, list[float]] = defaultdict(list)
    for (before, (_, ended)), (after, (started, _)) in zip(order, order[1:]):
        whole.append(started - ended)
        points = [ended, events["heard"].get(before), events["released"].get(before),
                  *(events[e].get(after) for e in ("thread", "claimed", "staged", "post")), started]
        if None in points or not points[2] <= points[3]:  # sent by another path (the sweeper, a worker)
            parts["other"].append(started - ended)
            continue
        for name, (a, b) in zip(PARTS, zip(points, points[1:])):
            parts[name].append(b - a)
    return whole, parts


def row(name: str, values: list[float]) -> str:
    if not values:
        return f"| {name} | 0 | - | - | - |"
    return (f"| {name} | {len(values)} | {percentile(values, 50):.1f} | {percentile(values, 90):.1f} | "
            f"{sum(values) / len(values):.1f} |")


def run(work: Path, *, servers: int, delay: float, jobs: int, cap: int = 1) -> list[str]:
    """The report's lines (markdown tables)."""
    trace = work / "trace.log"
    stack = Deployed(work, servers=servers, cap=cap, delay=delay, env={"RECKON_GAP_TRACE": str(trace)})
    body = orjson.dumps({"kind": "image", "workflow": workflow(DEFAULT_WORKFLOW_BYTES), "outputs": DEFAULT_OUTPUTS})
    try:
        stack.up()
        api_key, before = warmed(stack, body)
        time.sleep(1)
        trace.write_text("")
        cpu0 = {name: group_cpu(proc.pid) for name, proc in stack.procs.items()}
        wall0 = time.monotonic()
        post(stack.web_port, api_key, [f"gap-{i}" for i in range(jobs)], CONCURRENCY, body)
        wait_for(lambda: completed(stack.client) >= 1 + jobs, timeout=60 + jobs, interval=0.005,
                 what="the backlog did not complete")
        wall = time.monotonic() - wall0
        cpu = {name: group_cpu(proc.pid) - cpu0[name] for name, proc in stack.procs.items()}
        events = read_trace(trace)
        traced = any(events.values())
        whole: list[float] = []
        parts: dict[str, list[float]] = defaultdict(list)
        for port in stack.sim_ports:
            server_gaps, server_parts = gaps(executions(port, lambda p: p not in before), events)
            whole += server_gaps
            for name, values in server_parts.items():
                parts[name] += values
    finally:
        stack.down()
    lines = [f"{servers} x {delay:g} s, {jobs} jobs, cap {cap}: {wall:.2f} s", "",
             "| gap (ms) | n | p50 | p90 | mean |", "|---|---|---|---|---|", row("end -> next start", whole)]
    if traced:  # the trace was written: each gap's parts
        lines += [row(f"{a} -> {b}", parts[b]) for a, b in zip(("end", *PARTS), PARTS)]
        lines.append(row("sent by another path", parts["other"]))
    sims = sum(v for name, v in cpu.items() if name.startswith("sim"))
    cores = os.cpu_count() or 1
    lines += ["", "| process | CPU s | share of the cores |", "|---|---|---|",
              f"| sims | {sims:.2f} | {sims / (wall * cores):.0%} |"]
    lines += [f"| {name} | {v:.2f} | {v / (wall * cores):.0%} |" for name, v in sorted(cpu.items())
              if not name.startswith("sim")]
    total = sum(cpu.values())
    lines.append(f"| all | {total:.2f} | {total / (wall * cores):.0%} |")
    return lines


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.25)
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--cap", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reckon-gaps-") as tmp:
        print("\n".join(run(Path(tmp), servers=args.servers, delay=args.delay, jobs=args.jobs, cap=args.cap)))


if __name__ == "__main__":
    main()
