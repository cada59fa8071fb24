"""The deployed path, measured: the Procfile's processes with their default settings (gunicorn, a
Dramatiq worker with 2 processes x 4 threads, the watcher, the sweeper, watch mode on), two
simulated ComfyUI servers (``--delay 0``, cap 8 each), jobs posted over HTTP by client threads,
each asking for ``outputs`` outputs, timed from the first POST to the last completion.

``run`` returns the figures per job: Redis commands (``INFO commandstats`` delta over both
databases, ``info`` itself left out), Redis CPU, the stack's CPU, and Redis bytes per finished job
(``INFO memory`` before and after, the idempotency records included). With ``steps=True`` it
also follows ``MONITOR`` and attributes every command to the step that sent it (``STEPS``): a
script's own commands to the script, the others to the process that sent them (its connection's
``CLIENT SETNAME``). MONITOR slows Redis down, so CPU figures are taken from a run without it.
With ``profile=True`` (``--profile``) it times every script and command by Redis's own SLOWLOG
(ops/bench/slowlog.py: Redis CPU per step), which also counts each script call's commands: the
figures of ``steps`` without MONITOR (``calls``, ``sizes``, ``window``; not ``steps`` or ``broker``).

Used by the ``deployed`` phase of ops/bench/bench.py and by ``tests/faults/test_budget.py``.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson
import redis

from ops.bench.bench_drain import Phase
from ops.bench.memsplit import Snapshot, settled, snapshot
from ops.bench.benchlib import BIN, ROOT, free_port, group_cpu, in_threads, redis_cpu, wait_for
from ops.bench.receiver import Receiver
from ops.bench.slowlog import Profile, Slowlog, table
from ops.bench.steps import CLIENT_STEPS, TOOL, broker_call, script_verb, step_of

_MONITOR_RE = re.compile(r'^\d+\.\d+ \[(\d+) ([^\]]+)\] "([^"]+)"(?: "([^"]*)")?')
_ARG_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Figures(Phase):
    """A run's figures: ``Phase``'s (jobs, seconds, Redis and other CPU) and Redis's commands and bytes."""

    commands: int = 0
    bytes_per_job: float = 0.0
    steps: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    #: The broker's commands by what sent them (``Monitor.broker``) and how many calls that was.
    broker: Counter = field(default_factory=Counter)
    broker_calls: Counter = field(default_factory=Counter)
    trips: Counter = field(default_factory=Counter)
    #: Script verb -> calls (a step may run several scripts: "webhooks" its fan-out, take and outcome).
    scripts: Counter = field(default_factory=Counter)
    #: Step -> Counter of what each of its script calls cost (commands, the FCALL included) -> calls.
    sizes: dict[str, Counter] = field(default_factory=dict)
    #: How long MONITOR followed the run (s): what the time-driven shares are bounded by.
    window: float = 0.0
    #: With ``profile=True``: Redis's execution time per script and command (ops/bench/slowlog.py).
    profile: Profile | None = None
    #: Redis's memory after the run less before it (ops/bench/memsplit.py): keys, clients, the rest.
    memory: Snapshot | None = None

    @property
    def commands_per_job(self) -> float:
        return self.commands / self.jobs


def total_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for name, v in stats.items() if name not in ("cmdstat_info", "cmdstat_monitor"))


class Deployed:
    """A private redis-server and the stack on it, every process stopped by its PID on exit."""

    def __init__(self, work: Path, *, servers: int = 2, cap: int = 8, env: dict[str, str] | None = None,
                 options: str = "", delay: float = 0.0, library: str = "") -> None:
        #: A Functions library loaded before any process starts (ops/bench/luaprof.py: an instrumented
        #: copy of reckon's under its name, which the processes then find loaded and call).
        self.library = library
        self.work, self.redis_port, self.web_port, self.streams_port = work, free_port(), free_port(), free_port()
        work.mkdir(parents=True, exist_ok=True)
        self.sim_ports, self.delay = [free_port() for _ in range(servers)], delay  # each sim's prompt, s
        fleet = ",".join(f"sim{i}=http://127.0.0.1:{port};cap={cap}{options}" for i, port in enumerate(self.sim_ports))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RECKON_")} | {
            "RECKON_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "RECKON_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/1",
            "RECKON_PROVIDERS": fleet, "RECKON_BLOB_DIR": str(work / "blobs"), "PORT": str(self.web_port),
            "RECKON_STREAMS_PORT": str(self.streams_port),
            **(env or {}),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: This tool's own connection (its commands are left out of every figure: ``Monitor`` skips its
        #: name, ``run`` subtracts the polls it makes from the commandstats total).
        self.client = redis.Redis(port=self.redis_port, decode_responses=True, client_name=TOOL)

    def start(self, name: str, *argv: str) -> None:
        log = open(self.work / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def up(self) -> None:
        self.start("redis", "redis-server", "ops/redis.conf", "--port", str(self.redis_port), "--dir", str(self.work),
                   "--appendonly", "no", "--save", "")
        wait_for(self.client.ping)
        if self.library:
            self.client.function_load(self.library)
        for i, port in enumerate(self.sim_ports):
            self.start(f"sim{i}", str(BIN / "python"), "-m", "pipeline.providers.sim", "--port", str(port),
                       "--delay", str(self.delay))
        for port in self.sim_ports:
            wait_for(lambda: _get(port, "/queue") == 200)
        self.start("web", str(BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "api.app:create_app()")
        wait_for(lambda: _get(self.web_port, "/readyz") == 200, timeout=30)
        self.start("worker", str(BIN / "python"), "-m", "pipeline.work.worker", "pipeline.work.actors",
                   "--processes", "2", "--threads", "4")
        self.start("sweeper", str(BIN / "python"), "-m", "pipeline.work.sweeper")
        self.start("watcher", str(BIN / "python"), "-m", "pipeline.work.watcher")
        self.start("webhooks", str(BIN / "python"), "-m", "pipeline.webhooks.sender")
        self.start("streams", str(BIN / "gunicorn"), "-c", "ops/streams.conf.py", "api.streams.app:create_app()")
        wait_for(lambda: _get(self.streams_port, "/healthz") == 200, timeout=30)

    def tenant(self, name: str = "bench", allowance: int = 10**12) -> str:
        """Create a tenant (``reckon tenant create``) and an API key for it; the key."""
        def cli(*argv: str) -> str:
            return subprocess.run([str(BIN / "reckon"), *argv], cwd=ROOT, env=self.env, check=True,
                                  capture_output=True, text=True).stdout.strip()
        cli("tenant", "create", name, "--allowance", str(allowance))
        return cli("key", "create", name).splitlines()[-1]

    def stack_cpu(self) -> float:
        return sum(group_cpu(p.pid) for name, p in self.procs.items() if name != "redis")

    def down(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def workflow(size: int) -> dict:
    """A workflow of about ``size`` bytes of JSON (a prompt text pads it)."""
    return {"3": {"class_type": "KSampler", "inputs": {"seed": 5}},
            "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "x" * max(0, size - 120)}}}


def post(port: int, api_key: str, keys: list[str], concurrency: int, body: bytes) -> None:
    errors: list[str] = []

    def share(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for key in mine:
            conn.request("POST", "/v1/jobs", body, {"Authorization": f"Bearer {api_key}", "Idempotency-Key": key,
                                                     "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 202:
                errors.append(f"{resp.status}")
        conn.close()

    in_threads(share, [keys[i::concurrency] for i in range(concurrency)])
    if errors:
        raise RuntimeError(f"admission refused {len(errors)} jobs: {sorted(set(errors))}")


def completed(client: redis.Redis, tenant: str = "bench") -> int:
    from pipeline.state.keys import TenantKeys

    return int(client.hget(TenantKeys(tenant).counts, "completed") or 0)


class Monitor:
    """Follows MONITOR and counts each command by step (see the module's docstring)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.steps: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.broker: Counter[str] = Counter()
        self.broker_calls: Counter[str] = Counter()
        self.trips: Counter[str] = Counter()
        self.scripts: Counter[str] = Counter()
        self.sizes: dict[str, Counter[int]] = {}
        self.window, self._started = 0.0, 0.0
        self.lines: list[str] = []
        self._names: dict[str, str] = {}
        self._stop, self._listening = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._conn = redis.Redis(port=port, decode_responses=True, client_name=TOOL)

    def __enter__(self) -> "Monitor":
        self._thread.start()
        if not self._listening.wait(timeout=10):  # every command from here on is seen
            raise RuntimeError("MONITOR did not start")
        self._started = time.monotonic()
        return self

    def _run(self) -> None:
        with self._conn.monitor() as monitor:  # Redis has answered MONITOR's OK here
            self._listening.set()
            conn = monitor.connection
            while not self._stop.is_set():
                self.lines.append(conn.read_response())

    def __exit__(self, *exc: object) -> None:
        self.window = time.monotonic() - self._started
        self._stop.set()
        redis.Redis(port=self.port, client_name=TOOL).ping()  # one more line so the reader wakes and sees the stop
        self._thread.join(timeout=10)
        self._attribute()

    def _attribute(self) -> None:
        names = {c["addr"]: c["name"] for c in redis.Redis(port=self.port, decode_responses=True,
                                                            client_name=TOOL).client_list()}
        step = detail = "other"  # a script's own commands follow the line of the call that ran them
        size = 0  # the commands of the script call being read, its FCALL included (0: not a script call)
        for line in self.lines:
            match = _MONITOR_RE.match(str(line))
            if not match:
                continue
            _db, addr, command, first = match.groups()
            command = command.lower()
            if addr == "lua":
                self.steps[step] += 1
                size += 1 if size else 0
                if step.startswith("broker"):
                    self.broker[detail] += 1
                continue
            if size:
                self.sizes.setdefault(step, Counter())[size] += 1
                size = 0
            if names.get(addr) == TOOL or (command in ("info", "monitor", "client", "ping")
                                           and not names.get(addr, "").startswith("broker")):
                step = "other"  # this tool's own (a broker's ping or setname is the broker's)
                continue
            if command in ("fcall", "fcall_ro"):
                verb = script_verb(first or "")
                step = step_of(verb, names.get(addr, ""))
                self.calls[step] += 1
                self.scripts[verb] += 1
                size = 1
            else:
                name = names.get(addr, "")
                step = CLIENT_STEPS.get(name, name or "other")
                if step.startswith("broker"):
                    detail = f"{step[8:]} {broker_call(command, _ARG_RE.findall(str(line))[1:])}"
                    self.broker[detail] += 1
                    self.broker_calls[detail] += 1
            self.steps[step] += 1
            self.trips[step] += 1  # a command a process sent: one round trip (pipelines aside)
        if size:
            self.sizes.setdefault(step, Counter())[size] += 1


def run(work: Path, *, jobs: int = 200, outputs: int = 2, concurrency: int = 8, workflow_bytes: int = 10_240,
        steps: bool = False, cap: int = 8, env: dict[str, str] | None = None, webhook: bool = False, warm: bool = True,
        options: str = "", profile: bool = False, library: str = "",
        after: Callable[[redis.Redis], object] | None = None) -> Figures:
    """Post ``jobs`` jobs to a fresh deployed stack (each server at ``cap``) and measure them to their
    completion; with ``webhook``, the tenant has an endpoint for ``job.completed`` (a receiver in this
    process, on loopback) and the run ends when every completion was delivered; ``warm``: one job first, uncounted;
    ``library``: see ``Deployed``; ``after`` is called with this tool's client once the run is measured."""
    if webhook:
        env = {**(env or {}), "RECKON_WEBHOOK_ALLOW_PRIVATE": "1"}
    stack = Deployed(work, cap=cap, env=env, options=options, library=library)
    receiver = Receiver() if webhook else None
    try:
        stack.up()
        api_key = stack.tenant()
        client = stack.client
        if receiver is not None:
            receiver.register(stack.web_port, api_key)
        body = orjson.dumps({"kind": "image", "workflow": workflow(workflow_bytes), "outputs": outputs})
        if warm:
            post(stack.web_port, api_key, ["warm-0"], 1, body)  # every process connected, scripts loaded
            wait_for(lambda: completed(client) >= 1, timeout=60, what="the warm-up job did not complete")
            time.sleep(2.5)  # the warm-up job's sweeper and watcher passes are behind us
        mem0, calls0, redis0, cpu0 = settled(client), total_calls(client), redis_cpu(client), stack.stack_cpu()
        t0 = time.perf_counter()
        monitor = Monitor(stack.redis_port) if steps else None
        slow = Slowlog(stack.redis_port) if profile else None
        with monitor or nullcontext(), slow or nullcontext():
            post(stack.web_port, api_key, [f"job-{i}" for i in range(jobs)], concurrency, body)
            polls = 0

            def done() -> bool:
                nonlocal polls
                polls += 1
                return completed(client) >= jobs + warm and (receiver is None or receiver.count >= jobs + warm)

            wait_for(done, timeout=60 + jobs, what="the jobs did not complete")
            seconds = time.perf_counter() - t0
            time.sleep(2.5)  # the sweeper's and watcher's passes after the last completion
        calls = total_calls(client) - calls0 - polls - (slow.commands if slow else 0)  # the tool's own
        redis_s, cpu_s = redis_cpu(client) - redis0, stack.stack_cpu() - cpu0
        mem = snapshot(client) - mem0
        if after is not None:
            after(client)
        prof = slow.profile() if slow else None
        if monitor is None and slow is not None and prof is not None:  # the log counts commands as MONITOR does
            by_step, sizes = prof.scripts()
            return Figures(jobs, seconds, redis_s, cpu_s, commands=calls, bytes_per_job=mem.used / jobs, memory=mem,
                           profile=prof, calls=by_step, sizes=sizes, window=slow.window)
        if monitor is None:
            return Figures(jobs, seconds, redis_s, cpu_s, commands=calls, bytes_per_job=mem.used / jobs, memory=mem)
        return Figures(jobs, seconds, redis_s, cpu_s, commands=calls, bytes_per_job=mem.used / jobs, memory=mem,
                       steps=monitor.steps,
                       calls=monitor.calls, broker=monitor.broker, broker_calls=monitor.broker_calls,
                       trips=monitor.trips, scripts=monitor.scripts, sizes=monitor.sizes,
                       window=monitor.window, profile=prof)
    finally:
        stack.down()
        if receiver is not None:
            receiver.close()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--steps", action="store_true", help="attribute commands to steps (MONITOR; slower)")
    parser.add_argument("--broker", action="store_true", help="with --steps: the broker's commands by call and queue")
    parser.add_argument("--profile", action="store_true", help="Redis CPU per script and command (SLOWLOG at 0)")
    parser.add_argument("--workflow-bytes", type=int, default=10_240, help="each job's workflow, about")
    parser.add_argument("--top", type=int, default=10, help="with --profile: the scripts and commands shown")
    parser.add_argument("--shards", type=int, default=1, help="RECKON_SHARDS of the stack")
    parser.add_argument("--webhook", action="store_true", help="the tenant has an endpoint for job.completed")
    parser.add_argument("--cap", type=int, default=8, help="each server's cap (above --jobs: no job parks)")
    parser.add_argument("--no-warm-up", action="store_true", help="no job first: first-time structures counted")
    parser.add_argument("--price-per-second", type=int, default=0, help="each server's (jobs then: max_seconds 60)")
    args = parser.parse_args()
    from ops.bench.memory import TARGET_FINISHED_BYTES
    from pipeline.state import keys

    keys.use_shards(args.shards)  # this process reads the tenant's counts where the stack writes them
    with tempfile.TemporaryDirectory(prefix="reckon-deployed-") as tmp:
        per_second = {"RECKON_MAX_SECONDS_INTERACTIVE": "60"} if args.price_per_second else {}
        queue_cap = {"RECKON_QUEUE_CAP_INTERACTIVE": str(args.jobs)} if args.jobs > 1000 else {}  # all queued at once
        fig = run(Path(tmp), jobs=args.jobs, steps=args.steps or args.broker, cap=args.cap, webhook=args.webhook,
                  profile=args.profile, workflow_bytes=args.workflow_bytes,
                  env={"RECKON_SHARDS": str(args.shards), **per_second, **queue_cap}, warm=not args.no_warm_up,
                  options=f";price_per_second={args.price_per_second}" if args.price_per_second else "")
    print(f"{fig.jobs} jobs in {fig.seconds:.2f} s = {fig.rate:.1f} jobs/s; {fig.commands_per_job:.1f} commands/job;"
          f" Redis {fig.redis_us:.0f} us/job; machine {fig.machine_us:.0f} us/job; {fig.bytes_per_job:.0f} B/job"
          + (f"; measured over {fig.window:.1f} s" if fig.window else ""))
    if fig.memory is not None:
        print(f"memory: {fig.memory.per_job(fig.jobs)}; target {TARGET_FINISHED_BYTES} B/job"
              f" ({'met' if fig.bytes_per_job <= TARGET_FINISHED_BYTES else 'missed'})")
    for step, n in fig.steps.most_common():
        calls = f"{fig.calls[step] / fig.jobs:5.2f} calls" if fig.calls[step] else ""
        print(f"  {step:16s} {n / fig.jobs:7.1f} commands {fig.trips[step] / fig.jobs:6.2f} round trips  {calls}")
    if fig.profile is not None:
        print("\n".join(table(fig.profile, fig.jobs, fig.redis_s, top=args.top)))
    if args.broker:
        acked = sum(n for what, n in fig.broker_calls.items() if what.split()[1:2] == ["ack"]) / fig.jobs
        worker = fig.steps["broker: worker"] / fig.jobs
        print(f"broker: {acked:.2f} messages per job; the worker's {worker:.1f} commands are"
              f" {worker / max(acked, 1e-9):.1f} per message")
        print("broker commands per job (calls per job) by process, call and queue:")
        for what, n in fig.broker.most_common():
            print(f"  {what:40s} {n / fig.jobs:6.2f}  ({fig.broker_calls[what] / fig.jobs:.2f})")


if __name__ == "__main__":
    main()
