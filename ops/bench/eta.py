"""How often a job's first ETA range holds: the planner's (pipeline/work/planner.py) ranges against what happened.

One stack (ops/bench/deployed.py's ``Deployed``, every Procfile process with its default settings) over simulated
ComfyUI servers of different speeds (``python -m pipeline.providers.sim --delay D``, one D per server, cap 1).
After a warm-up (each server's run time measured by the planner), two phases, each a mixed backlog posted at
once by several tenants (batch and interactive):

- **arriving**: each job's first plan with an ETA (the shard's plan hash, read every ``POLL_SECONDS``: what
  ``GET /v1/jobs/{id}`` shows), made while the backlog was still being posted, against its real start (its
  ``running`` event) and finish (its ``completed`` event): a job planned before the others arrived is
  overtaken by those with lower tags (interactive, other tenants'), which no plan can know of;
- **steady**: the same, each job judged by its first plan read ``SETTLE_SECONDS`` after the last post
  returned (a planner pass has seen the whole backlog); jobs that started before then are left out;
- **paused**: as steady, with the fastest server paused (``reckon provider pause``) once a third of the
  backlog completed; each job still waiting is judged by its first plan read ``SETTLE_SECONDS`` after the
  pause (the planner's next pass has seen it), jobs that started before then are left out.

Per phase: jobs judged, the share whose start fell inside its start range, whose finish fell inside its
finish range, and both; the median width of each range; jobs that started before any plan gave them an ETA.

Run: ``PYTHONPATH=. .venv/bin/python ops/bench/eta.py [--delays 0.5,1,2] [--jobs 60]``; the ``eta`` phase of
ops/bench/bench.py runs it with the defaults.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import orjson

from ops.bench.benchlib import BIN, ROOT, in_threads, wait_for
from ops.bench.busy import call
from ops.bench.deployed import Deployed, post, workflow
from pipeline.state import keys
from pipeline.state.plans import Plan

DEFAULT_DELAYS = (0.5, 1.0, 2.0)
DEFAULT_JOBS = 60
#: The backlog's share per tenant and its class.
TENANTS = (("bench", 0.5, "batch"), ("tb", 0.3, "interactive"), ("tc", 0.2, "batch"))
POLL_SECONDS = 0.05
#: After the last post (or the pause), how long before a plan counts as the job's first (a sweeper pass is 1 s).
SETTLE_SECONDS = 1.5


class Speeds(Deployed):
    """Deployed, with each simulated server at its own delay (``delays``, s)."""

    def __init__(self, work: Path, delays: tuple[float, ...]) -> None:
        super().__init__(work, servers=len(delays), cap=1)
        self.delays = delays

    def start(self, name: str, *argv: str) -> None:
        if name.startswith("sim"):
            argv = (*argv[:-1], str(self.delays[int(name[3:])]))  # "--delay D" comes last
        super().start(name, *argv)

    def reckon(self, *argv: str) -> None:
        subprocess.run([str(BIN / "reckon"), *argv], cwd=ROOT, env=self.env, check=True, capture_output=True)


@dataclass
class Phase:
    name: str
    #: job -> (start range, finish range) of its first plan with an ETA (ms); jobs with none are left out.
    first: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    #: job -> (started, finished) (ms), from its events.
    actual: dict[str, tuple[int, int]] = field(default_factory=dict)

    def figures(self) -> dict[str, float]:
        """Jobs judged, shares inside (start, finish, both: 0..1) and median range widths (s)."""
        judged = [job for job in self.first if job in self.actual]
        inside = [(s[0] <= self.actual[j][0] <= s[1], f[0] <= self.actual[j][1] <= f[1])
                  for j in judged for s, f in [self.first[j]]]
        n = len(inside) or 1
        late = sum(1 for j in judged  # jobs that started or finished after their latest
                   if self.actual[j][0] > self.first[j][0][1] or self.actual[j][1] > self.first[j][1][1])
        return {"judged": len(judged), "jobs": len(self.actual), "start": sum(a for a, _ in inside) / n,
                "finish": sum(b for _, b in inside) / n, "both": sum(a and b for a, b in inside) / n, "late": late,
                **{f"{k}_width": median([(self.first[j][i][1] - self.first[j][i][0]) / 1000 for j in judged] or [0])
                   for i, k in enumerate(("start", "finish"))}}

    def row(self) -> str:
        f = self.figures()
        return (f"| {self.name} | {f['judged']} of {f['jobs']} | {f['start']:.0%} | {f['finish']:.0%} | "
                f"{f['both']:.0%} | {f['start_width']:.1f} s | {f['finish_width']:.1f} s | {f['late']} |")


def section(bench: Any) -> Any:
    """ops/bench/bench.py's ``eta`` phase: the defaults, with the issue's target (80% inside)."""
    from ops.bench.bench_report import Row, Section

    rows = []
    for phase in run(bench.work / "eta", DEFAULT_DELAYS, DEFAULT_JOBS):
        f = phase.figures()
        rows += [Row(f"{phase.name}: start and finish inside, % ({f['judged']:.0f} jobs)", None, f["both"] * 100,
                     ">= 80", f["both"] >= 0.8),
                 Row(f"{phase.name}: median width of the start range, s", None, f["start_width"]),
                 Row(f"{phase.name}: median width of the finish range, s", None, f["finish_width"])]
    return Section(f"eta: first ETA ranges against what happened, servers of {', '.join(map(str, DEFAULT_DELAYS))} s"
                   " a prompt", columns=("", "reckon"), rows=rows)


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def watch_plans(stack: Deployed, phase: Phase, stop: threading.Event, since: list[float]) -> None:
    """Keep each job's first plan with an ETA read at or after ``since[0]`` (time.time())."""
    while not stop.is_set():
        read_at = time.time()
        for shard in keys.shards():
            for job, raw in stack.client.hgetall(shard.plan).items():
                if job.startswith("d:") or job in phase.first or read_at < since[0]:
                    continue
                plan = Plan.unpack(raw)
                if plan.position is not None and plan.start and plan.finish:
                    phase.first[job] = (plan.start, plan.finish)
        stop.wait(POLL_SECONDS)


def actual(stack: Deployed, auth: dict[str, str], job_ids: list[str]) -> dict[str, tuple[int, int]]:
    found = {}
    for job_id in job_ids:
        events = call(stack.web_port, "GET", f"/v1/jobs/{job_id}/events", headers=auth[job_id.split(".")[0]])
        times = {e["to"]: _ms(e["at"]) for e in events["events"] if e["type"] == "state"}
        if "running" in times and "completed" in times:
            found[job_id] = (times["running"], times["completed"])
    return found


def done(stack: Deployed, api_keys: dict[str, str]) -> int:
    """The tenants' completed jobs."""
    return sum(int(stack.client.hget(keys.TenantKeys(t).counts, "completed") or 0) for t in api_keys)


def backlog(stack: Speeds, api_keys: dict[str, str], jobs: int, name: str, body: dict[str, Any],
            settle: bool = True, pause: str | None = None) -> Phase:
    phase, stop, since = Phase(name), threading.Event(), [float("inf") if settle else 0.0]
    before = {t: set(stack.client.zrange(keys.TenantKeys(t).jobs, 0, -1)) for t in api_keys}
    watcher = threading.Thread(target=watch_plans, args=(stack, phase, stop, since))
    watcher.start()
    try:
        def share(tenant: tuple[str, float, str]) -> None:
            t, part, priority = tenant
            post(stack.web_port, api_keys[t], [f"{name}-{t}-{i}" for i in range(round(jobs * part))], 2,
                 orjson.dumps({**body, "priority": priority}))

        total = sum(round(jobs * part) for _, part, _ in TENANTS)
        start = done(stack, api_keys)  # the count before this backlog
        in_threads(share, list(TENANTS))
        if settle and not pause:
            since[0] = time.time() + SETTLE_SECONDS
        if pause:
            wait_for(lambda: done(stack, api_keys) - start >= total // 3, timeout=120, what="a third of the backlog")
            stack.reckon("provider", "pause", pause)
            since[0] = time.time() + SETTLE_SECONDS
        wait_for(lambda: done(stack, api_keys) - start >= total, timeout=300, interval=0.2, what="the backlog")
    finally:
        stop.set()
        watcher.join()
    if pause:
        stack.reckon("provider", "clear", pause)
    ids = [j for t in api_keys for j in stack.client.zrange(keys.TenantKeys(t).jobs, 0, -1) if j not in before[t]]
    auth = {t: {"Authorization": f"Bearer {k}"} for t, k in api_keys.items()}
    phase.actual = actual(stack, auth, ids)
    if settle:  # judged on a plan made after the last post or the pause: jobs that started before are left out
        phase.actual = {j: a for j, a in phase.actual.items() if a[0] >= since[0] * 1000}
    return phase


def run(work: Path, delays: tuple[float, ...], jobs: int) -> list[Phase]:
    stack = Speeds(work, delays)
    body = {"kind": "image", "workflow": workflow(512), "outputs": 1}
    try:
        stack.up()
        api_keys = {t: stack.tenant(t) for t, _, _ in TENANTS}
        post(stack.web_port, api_keys["bench"], [f"warm-{i}" for i in range(4 * len(delays))], 4, orjson.dumps(body))
        wait_for(lambda: all(stack.client.hget(keys.ShardKeys(0).plan, f"d:sim{i}") for i in range(len(delays))),
                 timeout=120, what="every server's run time measured")
        wait_for(lambda: not stack.client.zcard(keys.ShardKeys(0).parked), timeout=120, what="the warm-up")
        time.sleep(3)
        return [backlog(stack, api_keys, jobs, "arriving", body, settle=False),
                backlog(stack, api_keys, jobs, "steady", body),
                backlog(stack, api_keys, jobs, "paused", body, pause="sim0")]
    finally:
        stack.down()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default=",".join(f"{d:g}" for d in DEFAULT_DELAYS),
                        help="each server's seconds per prompt, comma-separated")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="each phase's backlog")
    args = parser.parse_args()
    delays = tuple(float(d) for d in args.delays.split(","))
    with tempfile.TemporaryDirectory(prefix="reckon-eta-") as tmp:
        phases = run(Path(tmp), delays, args.jobs)
    print(f"servers: {', '.join(f'{d:g} s' for d in delays)} a prompt, cap 1; backlog {args.jobs} jobs, "
          f"{len(TENANTS)} tenants")
    print("| phase | jobs judged | start inside | finish inside | both | median start width | median finish width |"
          " late |")
    print("|---|---|---|---|---|---|---|---|")
    for phase in phases:
        print(phase.row())


if __name__ == "__main__":
    main()
