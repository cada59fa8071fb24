"""Redis CPU per step: how long Redis spent executing each script and command of a run, from its own
``SLOWLOG`` at threshold 0 (every command logged with its execution time in microseconds, the client
that sent it, and, for a script, each command it called, logged just before the call itself).

``INFO commandstats`` lumps every script into ``fcall`` and every Dramatiq call into ``evalsha``; the
log names the function (``FCALL reckon_<hash>_<verb>``: the script ``lua/<verb>.lua``) and Dramatiq's
verb and queue, so each script's time is its own. What the log times is the command's execution (its
Lua, the commands it calls, their keyspace events); reading the request and writing the reply (the
system calls of a round trip) and the event loop are outside it: ``Profile.overhead`` is the rest of
Redis's CPU (``INFO cpu``) over the same run, per top-level command.

``Slowlog`` drains the log every ``DRAIN_S`` in one transaction (``SLOWLOG GET -1``, ``SLOWLOG RESET``:
nothing is logged between them), so the log stays short and nothing is lost; it costs Redis about a
microsecond a command, so a run's CPU total is taken from a run without it (``ops/bench/deployed.py``).
Used by ``ops/bench/deployed.py`` (``run(profile=True)``, ``--profile``) and ``tests/faults/test_budget.py``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import redis

from ops.bench.steps import CLIENT_STEPS, TOOL, broker_call, script_verb, step_of

#: Seconds between drains (at about 3,000 commands a second the log holds well under ``MAX_LEN``).
DRAIN_S = 0.25
#: The log's length while measuring: more than a drain's worth, so none is pushed out before it is read.
MAX_LEN = 200_000
#: A script's own commands are logged with this address (Redis's Lua client).
LUA_ADDR = "?:0"


@dataclass
class Entry:
    """One logged command: its arguments (``Slowlog`` keeps the first 32, each cut to 128 bytes), its
    execution time in microseconds, and the name of the connection that sent it."""

    args: list[str]
    us: int
    addr: str
    client: str


@dataclass
class Cost:
    """What one script or command cost over a run: its calls, their microseconds in all and each, and,
    for a script, the share of the commands it called (``inner``: command -> microseconds, calls)."""

    calls: int = 0
    us: int = 0
    each: list[int] = field(default_factory=list)
    #: Commands a call cost (1, and for a script each command it called) -> calls.
    sizes: Counter = field(default_factory=Counter)
    inner_us: Counter = field(default_factory=Counter)
    inner_calls: Counter = field(default_factory=Counter)

    @property
    def median(self) -> float:
        return statistics.median(self.each) if self.each else 0.0


@dataclass
class Profile:
    """(step, script or command) -> its ``Cost``; ``commands``: the top-level commands it holds."""

    costs: dict[tuple[str, str], Cost]

    @property
    def us(self) -> int:
        return sum(c.us for c in self.costs.values())

    @property
    def commands(self) -> int:
        return sum(c.calls for (_, what), c in self.costs.items() if what != "MULTI")

    def overhead(self, redis_s: float) -> float:
        """Redis's CPU outside the commands' execution (``redis_s`` over the same run), µs per command."""
        return (redis_s * 1e6 - self.us) / max(self.commands, 1)

    def scripts(self) -> tuple[Counter, dict[str, Counter]]:
        """The script calls of each step, and what they cost in commands (``Cost.sizes``) step by step: what
        ops/bench/deployed.py's ``Monitor`` counts, for a run without MONITOR."""
        calls: Counter = Counter()
        sizes: dict[str, Counter] = {}
        for (step, what), cost in self.costs.items():
            if what.endswith(".lua") and not what.startswith("dispatch.lua"):
                calls[step] += cost.calls
                sizes.setdefault(step, Counter()).update(cost.sizes)
        return calls, sizes

    def by_step(self) -> Counter:
        steps: Counter = Counter()
        for (step, _), cost in self.costs.items():
            steps[step] += cost.us
        return steps


class Slowlog:
    """While open, every command Redis runs is logged and collected (``entries``), this tool's aside."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(port=port, client_name=TOOL)
        self.entries: list[Entry] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._saved: dict[str, str] = {}
        #: The commands this tool sent Redis (a run's command count leaves them out).
        self.commands = 0
        #: How long the log was on (s).
        self.window, self._started = 0.0, 0.0

    def __enter__(self) -> "Slowlog":
        for name in ("slowlog-log-slower-than", "slowlog-max-len"):
            self._saved.update({_text(k): _text(v) for k, v in self.client.config_get(name).items()})
        self.client.config_set("slowlog-max-len", MAX_LEN)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.execute_command("SLOWLOG", "RESET")
        self.commands += 5
        self._thread.start()
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.window = time.monotonic() - self._started
        self._stop.set()
        self._thread.join(timeout=10)
        self.drain()
        for name, value in self._saved.items():
            self.client.config_set(name, value)
            self.commands += 1

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_S):
            self.drain()

    def drain(self) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command("SLOWLOG", "GET", -1)
        pipe.execute_command("SLOWLOG", "RESET")
        logged = pipe.execute()[0]
        self.commands += 4  # MULTI, the two, EXEC
        for _id, _at, us, args, addr, name in sorted(logged, key=lambda e: e[0]):
            self.entries.append(Entry([a.decode(errors="replace") for a in args], int(us), addr.decode(),
                                      name.decode()))

    def profile(self) -> Profile:
        return attribute(self.entries)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def attribute(entries: list[Entry]) -> Profile:
    """Each top-level command's time to its (step, what): a script by its verb (``claim.lua``), a
    Dramatiq call by its verb and queue, any other command by its name; a script's own commands
    (logged before it, by the Lua client) are broken down inside its ``Cost``."""
    costs: dict[tuple[str, str], Cost] = defaultdict(Cost)
    inner: list[Entry] = []
    for entry in entries:
        if entry.addr == LUA_ADDR:
            inner.append(entry)
            continue
        called, inner = inner, []
        if entry.client == TOOL or not entry.args:
            continue
        command = entry.args[0].lower()
        if command in ("fcall", "fcall_ro") and len(entry.args) > 1:
            verb = script_verb(entry.args[1])
            key = (step_of(verb, entry.client), f"{verb}.lua")
        else:
            step = CLIENT_STEPS.get(entry.client, entry.client or "other")
            what = broker_call(command, entry.args[1:]) if command == "evalsha" else command.upper()
            key = (step, f"dispatch.lua {what}" if command == "evalsha" else what)
        cost = costs[key]
        cost.calls += 1
        cost.us += entry.us
        cost.each.append(entry.us)
        cost.sizes[1 + len(called)] += 1
        for e in called:
            cost.inner_us[e.args[0].lower()] += e.us
            cost.inner_calls[e.args[0].lower()] += 1
    return Profile(dict(costs))


def table(profile: Profile, jobs: int, redis_s: float, top: int = 10) -> list[str]:
    """The profile as lines: the ``top`` scripts and commands by µs a job, each with its calls a job, µs
    a call (mean, median), and, for a script, how much of it the commands it called took."""
    lines = [f"Redis CPU {redis_s / jobs * 1e6:,.0f} us/job; executing commands {profile.us / jobs:,.0f} us/job"
             f" ({profile.commands / jobs:.1f} top-level commands a job); the rest"
             f" {profile.overhead(redis_s):.1f} us a command (reading, replying, the event loop)",
             f"  {'step':16s} {'script or command':34s} {'calls/job':>9s} {'us/call':>8s} {'median':>7s}"
             f" {'us/job':>8s}  commands inside"]
    ranked = sorted(profile.costs.items(), key=lambda kv: -kv[1].us)
    for (step, what), cost in ranked[:top]:
        inside = ", ".join(f"{cmd} {us / cost.calls:.1f}" for cmd, us in cost.inner_us.most_common(4))
        lines.append(f"  {step:16s} {what[:34]:34s} {cost.calls / jobs:9.2f} {cost.us / cost.calls:8.1f}"
                     f" {cost.median:7.1f} {cost.us / jobs:8.1f}  {inside}")
    rest = sum(c.us for _, c in ranked[top:])
    lines.append(f"  {'the others':51s} {'':9s} {'':8s} {'':7s} {rest / jobs:8.1f}")
    lines.append("  by step: " + ", ".join(f"{s} {us / jobs:.0f}" for s, us in profile.by_step().most_common()))
    return lines
