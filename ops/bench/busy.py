"""GPU busy time, measured from outside: how much of the servers' time a backlog keeps them executing,
reckon against the servers' own queues, in one run (issue 33's measure).

One stack (ops/bench/deployed.py's ``Deployed``: every Procfile process with its default settings, watch
mode) over ``servers`` simulated ComfyUI servers (``python -m pipeline.providers.sim --delay D``), each of
cap ``cap`` in reckon's fleet. The simulated server runs one prompt at a time, as ComfyUI does (one
executor thread); ``run`` checks it from the servers' own timestamps and refuses a run where two
prompts of one server overlapped. After one warm-up job through reckon (uncounted):

- **anchor**: ``jobs`` prompts posted straight into the servers' own queues (``POST /prompt``, prompt i to
  server i mod ``servers``, one client thread per server), timed from the first post to the last
  prompt's end (the server's own ``execution_success`` timestamp);
- **reckon**: ``jobs`` jobs posted over HTTP (``POST /v1/jobs``, 8 client threads, as deployed.py posts),
  timed from the first post to the last completion (the tenant's completed count, polled every 5 ms);
- busy = the sum of the prompts' execution times (each server's ``execution_start`` to its end, from
  ``/history``; the prompts are those of ``/sim/charges``, the ledger of every execution) / (servers x
  the makespan); the ratio is reckon's busy / the anchor's;
- **idle overhead** (``idle`` > 0): then ``idle`` single jobs one after another, each after the previous
  completed and ``IDLE_PAUSE_SECONDS`` more: the job view's ``created_at`` to its ``completed`` event,
  less D (both on Redis's clock, in ms).

Run: ``PYTHONPATH=. .venv/bin/python ops/bench/busy.py --servers 16 --delay 0.2 --jobs 800 --cap 1
[--idle 50]``; the ``busy`` phase of ops/bench/bench.py runs it at 2 x 0.25 s and 16 x 0.2 s.
"""

from __future__ import annotations

import http.client
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import orjson

from ops.bench.benchlib import in_threads, percentile, wait_for
from ops.bench.deployed import Deployed, completed, post, workflow

#: Each job's workflow size (bytes of JSON) and outputs; the anchor's prompts carry the same graph.
DEFAULT_WORKFLOW_BYTES = 1024
DEFAULT_OUTPUTS = 1
#: The client threads posting reckon's backlog (as deployed.py's run).
CONCURRENCY = 8
#: How often the end of reckon's backlog and of an idle job is looked for (the tenant's completed count).
POLL_SECONDS = 0.005
#: The quiet after each idle job's completion before the next is posted.
IDLE_PAUSE_SECONDS = 0.25
#: The anchor's prompts' id prefix and websocket client id (reckon's watcher hears none of them).
ANCHOR = "busy-anchor"


@dataclass
class Busy:
    """One side's figures: the prompts executed, the makespan and the servers' executing time (s)."""

    servers: int
    prompts: int
    makespan: float
    executing: float

    @property
    def busy(self) -> float:
        return self.executing / (self.servers * self.makespan)


@dataclass
class Result:
    servers: int
    delay: float
    jobs: int
    cap: int
    anchor: Busy | None = None
    reckon: Busy | None = None
    #: Each idle job's completed - created - D, ms.
    idle_ms: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.reckon.busy / self.anchor.busy if self.anchor and self.reckon else None

    def idle(self, q: float) -> float | None:
        return percentile(self.idle_ms, q) if self.idle_ms else None

    def row(self) -> str:
        """``| servers x D | jobs | cap | anchor | reckon | ratio | idle p50 / p90 |`` (a markdown row)."""
        def pct(side: Busy | None) -> str:
            return f"{side.busy:.1%} ({side.makespan:.2f} s)" if side else "-"

        idle = f"{self.idle(50):.0f} / {self.idle(90):.0f} ms ({len(self.idle_ms)})" if self.idle_ms else "-"
        ratio = f"{self.ratio:.3f}" if self.ratio is not None else "-"
        return (f"| {self.servers} x {self.delay:g} s | {self.jobs} | {self.cap} | {pct(self.anchor)} | "
                f"{pct(self.reckon)} | {ratio} | {idle} |")


def call(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    """One request on a connection of its own: the simulated server writes an answer's head and body
    apart, so on a kept-alive connection each answer waits out the client's delayed ACK (about 40 ms)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, orjson.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        answer = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path.split('?')[0]} answered {resp.status}")
    return orjson.loads(answer) if answer else None


def charged(port: int) -> list[str]:
    """The prompts the server executed, from its charge ledger (one entry per execution)."""
    return [charge["prompt_id"] for charge in call(port, "GET", "/sim/charges")["charges"]]


def warmed(stack: Deployed, body: bytes) -> tuple[str, set[str]]:
    """A tenant's API key, once one warm-up job through the stack completed (every process connected, its
    scripts loaded), and the prompts the servers executed so far (a measure after it counts none of them)."""
    api_key = stack.tenant()
    post(stack.web_port, api_key, ["warm-0"], 1, body)
    wait_for(lambda: completed(stack.client) >= 1, timeout=60, what="the warm-up job did not complete")
    return api_key, {prompt_id for port in stack.sim_ports for prompt_id in charged(port)}


def executions(port: int, mine: Callable[[str], bool]) -> dict[str, tuple[int, int]]:
    """Each prompt the server executed that is ``mine`` -> its execution's (start, end), ms, from the
    server's own timestamps in ``/history``."""
    spans = {}
    for prompt_id in filter(mine, charged(port)):
        entry = call(port, "GET", f"/history/{prompt_id}")[prompt_id]
        stamps = {kind: data["timestamp"] for kind, data in entry["status"]["messages"] if "timestamp" in data}
        end = stamps.get("execution_success") or stamps.get("execution_interrupted") or stamps["execution_error"]
        spans[prompt_id] = (stamps["execution_start"], end)
    return spans


def overlaps(spans: list[tuple[int, int]]) -> int:
    """How many of one server's executions started before the one before them ended."""
    ordered = sorted(spans)
    return sum(1 for before, after in zip(ordered, ordered[1:]) if after[0] < before[1])


def measured(stack: Deployed, mine: Callable[[str], bool], started: float, ended: float | None) -> Busy:
    """The busy figures of the prompts that are ``mine`` from ``started`` (s since the epoch) to
    ``ended`` (None: the last prompt's end)."""
    prompts, total, last = 0, 0, 0
    for port in stack.sim_ports:
        spans = list(executions(port, mine).values())
        if overlaps(spans):
            raise RuntimeError(f"a simulated server ran two prompts at once ({overlaps(spans)} times)")
        prompts += len(spans)
        total += sum(end - start for start, end in spans)
        last = max([last, *(end for _, end in spans)])
    makespan = (ended if ended is not None else last / 1000) - started
    return Busy(len(stack.sim_ports), prompts, makespan, total / 1000)


def anchor(stack: Deployed, jobs: int, graph: dict[str, Any], outputs: int) -> Busy:
    """``jobs`` prompts posted straight into the servers' queues, spread evenly; measured to the last end."""
    ids = [f"{ANCHOR}-{i}" for i in range(jobs)]
    servers = len(stack.sim_ports)

    extra = {"reckon_outputs": list(range(outputs))}
    errors: list[Exception] = []

    def share(index: int) -> None:
        try:
            for prompt_id in ids[index::servers]:
                call(stack.sim_ports[index], "POST", "/prompt",
                     {"prompt": graph, "prompt_id": prompt_id, "client_id": ANCHOR, "extra_data": extra})
        except (OSError, RuntimeError) as exc:
            errors.append(exc)

    started = time.time()
    in_threads(share, list(range(servers)))
    if errors:
        raise RuntimeError(f"a server refused the anchor's prompts: {errors[0]}")

    def drained() -> bool:
        return all(not (q["queue_running"] or q["queue_pending"])
                   for q in (call(port, "GET", "/queue") for port in stack.sim_ports))

    wait_for(drained, timeout=60 + jobs, what="the anchor's prompts did not run")
    return measured(stack, set(ids).__contains__, started, None)


def backlog(stack: Deployed, api_key: str, jobs: int, body: bytes, before: set[str]) -> Busy:
    """``jobs`` jobs posted to reckon over HTTP; measured to the last completion."""
    done = completed(stack.client)
    started = time.time()
    post(stack.web_port, api_key, [f"busy-{i}" for i in range(jobs)], CONCURRENCY, body)
    wait_for(lambda: completed(stack.client) >= done + jobs, timeout=60 + jobs, interval=POLL_SECONDS,
             what="reckon's backlog did not complete")
    ended = time.time()
    return measured(stack, lambda prompt_id: prompt_id not in before, started, ended)


def _ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def idle(stack: Deployed, api_key: str, count: int, body: bytes, delay: float) -> list[float]:
    """``count`` single jobs, one after another: each one's completed - created - ``delay``, ms."""
    auth = {"Authorization": f"Bearer {api_key}"}
    overheads = []
    for n in range(count):
        done = completed(stack.client)
        job = call(stack.web_port, "POST", "/v1/jobs", orjson.loads(body), auth | {"Idempotency-Key": f"idle-{n}"})
        wait_for(lambda: completed(stack.client) > done, timeout=60, interval=POLL_SECONDS,
                 what=f"idle job {n} did not complete")
        view = call(stack.web_port, "GET", f"/v1/jobs/{job['id']}", headers=auth)
        events = call(stack.web_port, "GET", f"/v1/jobs/{job['id']}/events", headers=auth)["events"]
        ended = next(e["at"] for e in events if e["type"] == "state" and e["to"] == "completed")
        overheads.append(_ms(ended) - _ms(view["created_at"]) - delay * 1000)
        time.sleep(IDLE_PAUSE_SECONDS)
    return overheads


def run(work: Path, *, servers: int, delay: float, jobs: int, cap: int = 1, idle_jobs: int = 0,
        outputs: int = DEFAULT_OUTPUTS, workflow_bytes: int = DEFAULT_WORKFLOW_BYTES) -> Result:
    """The anchor and reckon's backlog (``jobs`` > 0), then ``idle_jobs`` idle jobs, on one fresh stack."""
    stack = Deployed(work, servers=servers, cap=cap, delay=delay)
    result = Result(servers, delay, jobs, cap)
    graph = workflow(workflow_bytes)
    body = orjson.dumps({"kind": "image", "workflow": graph, "outputs": outputs})
    try:
        stack.up()
        api_key = stack.tenant()
        post(stack.web_port, api_key, ["warm-0"], 1, body)  # every process connected, scripts loaded
        wait_for(lambda: completed(stack.client) >= 1, timeout=60, what="the warm-up job did not complete")
        if jobs:
            result.anchor = anchor(stack, jobs, graph, outputs)
            before = {prompt_id for port in stack.sim_ports for prompt_id in charged(port)}
            time.sleep(1)  # the warm-up's and the anchor's passes behind us
            result.reckon = backlog(stack, api_key, jobs, body, before)
        if idle_jobs:
            time.sleep(1)
            result.idle_ms = idle(stack, api_key, idle_jobs, body, delay)
        return result
    finally:
        stack.down()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.25, help="seconds each prompt executes (the sim's)")
    parser.add_argument("--jobs", type=int, default=120, help="the backlog (0: the idle overhead only)")
    parser.add_argument("--cap", type=int, default=1, help="each server's cap in reckon's fleet")
    parser.add_argument("--idle", type=int, default=0, help="then this many single jobs on the idle stack")
    parser.add_argument("--outputs", type=int, default=DEFAULT_OUTPUTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reckon-busy-") as tmp:
        result = run(Path(tmp), servers=args.servers, delay=args.delay, jobs=args.jobs, cap=args.cap,
                     idle_jobs=args.idle, outputs=args.outputs)
    print("| servers x D | jobs | cap | the servers' own queues (makespan) | reckon (makespan) | ratio |"
          " idle overhead p50 / p90 (jobs) |")
    print("|---|---|---|---|---|---|---|")
    print(result.row())


if __name__ == "__main__":
    main()
