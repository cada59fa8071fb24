"""The idle overhead, step by step: where a single job on an idle stack spends the time its
``completed`` event is later than its ``created_at`` plus D (issue 33; ops/bench/busy.py ``--idle``).

One stack (ops/bench/deployed.py's ``Deployed``, cap 1, watch mode) over ``servers`` simulated servers of
delay D; after a warm-up job, ``jobs`` single jobs one after another (as busy.py's idle part). For each, the
moments it passed, all on this host's clock (Redis's ``TIME`` is the same clock here), from what the stack
records anyway:

- ``created``, and each state change, from the job's events (``created_at``; ``running`` is the claim);
- the prompt's ``execution_start`` and ``execution_success`` from the server's ``/history``;
- the watcher hearing the end (its ``prompt of ... ended`` line) and each state change's log line (ms);
- any line ``timeline <step> <job id>`` a process logs: what a temporary instrumentation writes to split
  a step further (the message fetched, the POST sent, the /history read, the outputs stored); none ships.

It prints each step's p50 and p90 from the step before it (ms) in the order the steps happened, and the
overhead (completed - created - D). Run: ``PYTHONPATH=. .venv/bin/python ops/bench/timeline.py
--servers 2 --delay 0.25 --jobs 30``.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from pathlib import Path

import orjson

from ops.bench.benchlib import percentile, wait_for
from ops.bench.busy import IDLE_PAUSE_SECONDS, POLL_SECONDS, _ms, call, executions, warmed
from ops.bench.deployed import Deployed, completed, workflow

#: The log line of the watcher hearing a prompt end (pipeline/work/watcher.py ``ServerWatch._collect``).
HEARD = "prompt of "


def stamps_from_logs(work: Path) -> dict[str, dict[str, float]]:
    """Job id -> step -> the first time (ms since the epoch) a line of the stack's logs marks it."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for path in work.glob("*.log"):
        for raw in path.read_bytes().splitlines():
            if not raw.startswith(b"{"):
                continue
            line = orjson.loads(raw)
            msg, at = str(line.get("msg", "")), _ms(line["ts"])
            if msg == "state change" and line.get("job"):
                step, job = f"log {line['from']}->{line['to']}", line["job"]
            elif msg.startswith(HEARD) and " ended at " in msg:
                step, job = "watcher heard the end", msg[len(HEARD):].split(" ")[0]
            elif msg.startswith("timeline "):
                _, step, job = msg.split(" ", 2)
            else:
                continue
            found[job].setdefault(step, at)
    return found


def one(stack: Deployed, api_key: str, body: bytes, n: int) -> tuple[str, dict[str, float]]:
    """Post one job and wait for its completion; its id and the moments its events and its prompt give."""
    auth = {"Authorization": f"Bearer {api_key}"}
    done = completed(stack.client)
    job = call(stack.web_port, "POST", "/v1/jobs", orjson.loads(body), auth | {"Idempotency-Key": f"line-{n}"})
    wait_for(lambda: completed(stack.client) > done, timeout=60, interval=POLL_SECONDS,
             what=f"job {n} did not complete")
    view = call(stack.web_port, "GET", f"/v1/jobs/{job['id']}", headers=auth)
    stamps = {"created": _ms(view["created_at"])}
    for event in call(stack.web_port, "GET", f"/v1/jobs/{job['id']}/events", headers=auth)["events"]:
        if event["type"] == "state":
            stamps.setdefault(f"event ->{event['to']}", _ms(event["at"]))
    return job["id"], stamps


def run(work: Path, *, servers: int, delay: float, jobs: int) -> tuple[list[str], dict[str, list[float]]]:
    """The steps in the order they happened (by their median moment) and each one's times from the step
    before it (ms), over ``jobs`` idle jobs; the step ``overhead`` is completed - created - D."""
    stack = Deployed(work, servers=servers, cap=1, delay=delay)
    body = orjson.dumps({"kind": "image", "workflow": workflow(1024), "outputs": 1})
    per_job: dict[str, dict[str, float]] = {}
    try:
        stack.up()
        api_key, before = warmed(stack, body)
        time.sleep(1)
        for n in range(jobs):
            job_id, stamps = one(stack, api_key, body, n)
            per_job[job_id] = stamps
            time.sleep(IDLE_PAUSE_SECONDS)
        spans = [span for port in stack.sim_ports
                 for span in executions(port, lambda prompt_id: prompt_id not in before).values()]
        time.sleep(0.5)  # the last lines flushed
        logged = stamps_from_logs(work)
    finally:
        stack.down()
    for job_id, stamps in per_job.items():
        stamps.update(logged.get(job_id, {}))
        end = stamps["event ->completed"]
        start, ended = next((s, e) for s, e in spans if stamps["created"] <= s <= end)
        stamps["execution_start"], stamps["execution_success"] = start, ended
    return steps(list(per_job.values()), delay)


def steps(jobs: list[dict[str, float]], delay: float) -> tuple[list[str], dict[str, list[float]]]:
    """Order the steps every job has by their median offset from ``created``; each one's deltas."""
    common = set.intersection(*(set(stamps) for stamps in jobs))
    order = sorted(common, key=lambda step: percentile([s[step] - s["created"] for s in jobs], 50))
    deltas: dict[str, list[float]] = {step: [] for step in order}
    for stamps in jobs:
        for before, after in zip(order, order[1:]):
            deltas[after].append(stamps[after] - stamps[before])
    deltas["overhead"] = [s["event ->completed"] - s["created"] - delay * 1000 for s in jobs]
    return order, deltas


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.25)
    parser.add_argument("--jobs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reckon-timeline-") as tmp:
        order, deltas = run(Path(tmp), servers=args.servers, delay=args.delay, jobs=args.jobs)
    print("| step | from the step before: p50 / p90 ms |")
    print("|---|---|")
    for step in [*order[1:], "overhead"]:
        print(f"| {step} | {percentile(deltas[step], 50):.1f} / {percentile(deltas[step], 90):.1f} |")


if __name__ == "__main__":
    main()
