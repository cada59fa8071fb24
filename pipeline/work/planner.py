"""The planner: each sweeper pass, per shard, simulates dispatch over the parked jobs and writes each one's
queue position and ETA range (and each watched prompt's finish range) to the shard's plan (pipeline/state/plans.py).

What it reads, per shard and pass, in one round trip: the first ``MAX_PLANNED`` parked jobs with their scores
(the order unpark serves them: class, then finish tag, the batch jobs moved by the starvation bound first), the
fleet hash (each server's slots in use, stop marks, paused classes, the watched prompts, and the placement of
each parked job only some servers can run) and each server's run times as its watcher heard them
(``keys.RUN_TIMES``, pipeline/work/runclock.py). Nothing on a job's own path: no job record is read.

A server none of whose run times were heard yet is measured from the passes: its prompts that left the watch
list since the last pass ended there, and its run time is its busy time (passes with a prompt in flight at both
ends) over the prompts that ended, over the last ``WINDOW`` passes. That undercounts a server that ends more
prompts a pass than its cap (one it sends and ends between two passes is never seen): a fallback only.

The simulation (``simulate``): each parked job, in order, goes to the usable server it can run on whose slot
frees first (a server of cap ``c`` takes its k-th prompt when its (k-c)-th ends), and runs after the prompt
before it there. Run twice: with each server's short run time (p10 of those heard x ``LOW``) and its long one
(p90 x ``HIGH`` + ``GAP_MS``), plus ``SLACK_MS`` on the latest for the pass and the claim: the earliest and
latest start and finish. A job with a checkpoint (its placement in the fleet hash, '<servers>|<ckpt>') runs,
on a server that has run it warm ``MIN_HEARD`` times, for that checkpoint's run times, and a server whose
checkpoint (``ckpt:<server>`` in the fleet hash, then the last job the simulation sent it) is another one adds a
model load's extra time (``checkpoint_times``). A job no usable server can run (paused,
unreachable) or whose class is paused gets a position and no ETA.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.state import keys, plans
from pipeline.state.plans import Plan
from pipeline.work import runclock

#: Parked jobs planned per shard and pass, at most (the first in dispatch order; the rest get no plan).
MAX_PLANNED = 5_000
#: Passes over which a server's run time is measured.
WINDOW = 60
#: Factors on the measured run times for the earliest and the latest times.
LOW, HIGH = 0.8, 1.3
#: Added to the latest times (ms): a sweeper pass (the run time's granularity) and a claim's latency.
SLACK_MS = 1_500
#: Run times heard (pipeline/work/runclock.py) a server needs before they are used rather than the passes' measure.
MIN_HEARD = 3
#: Added to each latest heard run time (ms): the claim and the send between two prompts at cap 1.
GAP_MS = 50


@dataclass
class Lane:
    """A server as the simulation sees it: its cap, run time, and when each prompt sent to it ends (ms); the
    run time per checkpoint where enough were heard (``by_ckpt``), a model load's extra time per checkpoint
    (``loads``, else ``load_ms``) and the checkpoint it holds (``ckpt``: the last prompt sent with one)."""

    cap: int
    run_ms: float
    ends: list[float] = field(default_factory=list)
    ckpt: str | None = None
    by_ckpt: dict[str, float] = field(default_factory=dict)
    loads: dict[str, float] = field(default_factory=dict)
    load_ms: float = 0.0

    def slot_free(self, now: float) -> float:
        return now if len(self.ends) < self.cap else max(now, self.ends[len(self.ends) - self.cap])

    def send(self, at: float, ckpt: str | None = None) -> float:
        begin = max(at, self.ends[-1]) if self.ends else at
        run = self.by_ckpt.get(ckpt, self.run_ms) if ckpt else self.run_ms
        if ckpt and self.ckpt and ckpt != self.ckpt:  # another model is loaded first
            run += self.loads.get(ckpt, self.load_ms)
        self.ckpt = ckpt or self.ckpt
        self.ends.append(begin + run)
        return self.ends[-1]


def simulate(order: list[tuple[str, frozenset[str], str | None]], lanes: dict[str, Lane],
             now: float) -> dict[str, tuple[float, float]]:
    """Job id -> (start, finish) for each job of ``order`` (id, servers it may use, checkpoint) a lane can run."""
    times = {}
    for job_id, able, ckpt in order:
        usable = [name for name in sorted(able) if name in lanes]
        if not usable:
            continue
        name = min(usable, key=lambda n: (lanes[n].slot_free(now), len(lanes[n].ends)))
        start = lanes[name].slot_free(now)
        times[job_id] = (start, lanes[name].send(start, ckpt))
    return times


Side = tuple[dict[str, float], dict[str, float], float]


def checkpoint_times(heard: dict[str, dict[str, list[int]]]) -> tuple[Side, Side]:
    """One server's checkpoints as heard (runclock.parse_ckpts), for the earliest then the latest times: the
    run time of each checkpoint with ``MIN_HEARD`` warm runs (p10 x LOW, p90 x HIGH + GAP_MS), a load's extra
    time of each such checkpoint with a load heard (the loads' median less the warm runs', x LOW, x HIGH), and
    for a checkpoint without, the median of those extras (0 if none)."""
    runs: tuple[dict[str, float], dict[str, float]] = ({}, {})
    extras: tuple[dict[str, float], dict[str, float]] = ({}, {})
    for ckpt, kept in heard.items():
        warm, load = sorted(kept.get("warm", ())), sorted(kept.get("load", ()))
        if len(warm) < MIN_HEARD:
            continue
        runs[0][ckpt], runs[1][ckpt] = warm[len(warm) // 10] * LOW, warm[-1 - len(warm) // 10] * HIGH + GAP_MS
        if load:
            extra = max(0, load[len(load) // 2] - warm[len(warm) // 2])
            extras[0][ckpt], extras[1][ckpt] = extra * LOW, extra * HIGH
    medians = [sorted(side.values())[len(side) // 2] if side else 0.0 for side in extras]
    return (runs[0], extras[0], medians[0]), (runs[1], extras[1], medians[1])


class RunTimes:
    """Each server's run time, from the prompts that leave its watch list between passes."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, int]] = {}  # server -> watched job -> first seen (ms)
        self.busy: dict[str, int] = {}
        self.head: dict[str, int] = {}  # server -> when its current prompt began, as far as passes tell (ms)
        self.samples: dict[str, deque[tuple[int, int]]] = {}  # server -> (busy ms, prompts ended) a pass
        self.last_ms: int | None = None

    def observe(self, now: int, watched: dict[str, set[str]], busy: dict[str, int]) -> None:
        for server, count in busy.items():
            before, now_watched = self.seen.get(server, {}), watched.get(server, set())
            ended = len(before.keys() - now_watched)
            # busy at both ends of the pass, busy throughout (as far as passes tell): a pass in which the server
            # fell idle would count its idle end as run time
            if self.last_ms is not None and self.busy.get(server, 0) > 0 and count > 0:
                self.samples.setdefault(server, deque(maxlen=WINDOW)).append((now - self.last_ms, ended))
            if ended or (count > 0 and self.busy.get(server, 0) == 0):
                self.head[server] = now
            self.seen[server] = {job: before.get(job, now) for job in now_watched}
            self.busy[server] = count
        self.last_ms = now

    def run_ms(self, server: str) -> int | None:
        """Busy time over prompts ended, up to the last pass that saw one end (the prompt running since
        is not half counted), or None before any ended in the window."""
        window = list(self.samples.get(server, ()))
        while window and window[-1][1] == 0:
            window.pop()
        ended = sum(n for _, n in window)
        return int(sum(ms for ms, _ in window) / ended) if ended else None

    def in_flight(self, server: str) -> list[str]:
        """The server's watched prompts, the longest watched first (the one running, most likely)."""
        return sorted(self.seen.get(server, {}), key=lambda job: (self.seen[server][job], job))


class Planner:
    """Plans every shard once a pass (``plan``); ``servers``: name -> cap, as the workers claim with."""

    def __init__(self, client: Any, servers: dict[str, int]) -> None:
        self.client, self.servers = client, servers
        self.times = {shard.n: RunTimes() for shard in keys.shards()}
        self.wrote: dict[int, bool] = {}
        self.ckpts: dict[str, tuple[Side, Side]] = {}  # server -> its checkpoints' times (``checkpoint_times``)

    def plan(self, now: int) -> None:
        for shard in keys.shards():
            self.plan_shard(shard, now)

    def plan_shard(self, shard: keys.ShardKeys, now: int) -> dict[str, Plan]:
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(shard.parked, 0, MAX_PLANNED - 1, withscores=True)
        pipe.hgetall(shard.fleet)
        pipe.hgetall(keys.RUN_TIMES)
        parked, fleet, heard = pipe.execute()
        watched: dict[str, set[str]] = {}
        for name, value in fleet.items():
            if name.startswith("w:"):
                watched.setdefault(orjson.loads(value)["server"], set()).add(name[2:])
        busy = {server: int(fleet.get(f"busy:{server}", 0)) for server in self.servers}
        times = self.times.setdefault(shard.n, RunTimes())
        times.observe(now, watched, busy)
        measured, spans = self._run_times(runclock.parse(heard), times)
        self.ckpts = {server: checkpoint_times(kept) for server, kept in runclock.parse_ckpts(heard).items()}
        found = self._plans(parked, fleet, times, spans, now)
        if found or self.wrote.get(shard.n, True):
            plans.write(self.client, shard, found, measured)
            self.wrote[shard.n] = bool(found)
        return found

    def _run_times(self, heard: dict[str, list[int]],
                   times: RunTimes) -> tuple[dict[str, int], dict[str, tuple[float, float]]]:
        """Each server's run time (ms: the median heard, else the passes' measure) and the run times the
        earliest and the latest times take: the heard ones' p10 x LOW and p90 x HIGH + GAP_MS (the claim and
        the send between two prompts, not in a heard run time), else the passes' measure x LOW and x HIGH."""
        measured, spans = {}, {}
        for server in self.servers:
            runs = sorted(heard.get(server, ()))
            if len(runs) >= MIN_HEARD:
                measured[server] = runs[len(runs) // 2]
                spans[server] = (runs[len(runs) // 10] * LOW, runs[-1 - len(runs) // 10] * HIGH + GAP_MS)
            elif (ms := times.run_ms(server)) is not None:
                measured[server], spans[server] = ms, (ms * LOW, ms * HIGH)
        return measured, spans

    def _plans(self, parked: list[tuple[str, float]], fleet: dict[str, str], times: RunTimes,
               spans: dict[str, tuple[float, float]], now: int) -> dict[str, Plan]:
        everyone = frozenset(self.servers)
        stopped = {server for server in self.servers
                   if any(f"{reason}:{server}" in fleet for reason in keys.SERVER_BLOCKS)}
        order, position, open_order = [], {}, []
        ahead: dict[frozenset[str], int] = {}  # jobs so far per set of servers they can run on (a few sets)
        for job_id, score in parked:
            named, _, ckpt = fleet.get(f"p:{job_id}", "").partition("|")
            able = frozenset(named.split(",")) & everyone if named else everyone
            position[job_id] = sum(n for other, n in ahead.items() if other & able)  # competing for its servers
            ahead[able] = ahead.get(able, 0) + 1
            order.append((job_id, able))
            cls = "interactive" if 0 <= score < keys.BATCH_RANK else "batch"
            if f"pause_class:{cls}" not in fleet:
                open_order.append((job_id, able - stopped, ckpt or None))
        ranges, running = self._ranges(open_order, fleet, times, spans, now)
        found = {job_id: Plan(position[job_id], *ranges.get(job_id, (None, None))) for job_id, _ in order}
        found.update({job_id: Plan(finish=finish) for job_id, finish in running.items()})
        return found

    def _ranges(self, order: list[tuple[str, frozenset[str], str | None]], fleet: dict[str, str], times: RunTimes,
                spans: dict[str, tuple[float, float]], now: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(job -> (start range, finish range)) for the parked, (job -> finish range) for the watched."""
        if not spans:
            return {}, {}
        fallback = sorted(spans.values())[len(spans) // 2]  # a server not measured yet: the median
        bounds: list[dict[str, tuple[float, float]]] = []
        flights: list[dict[str, float]] = []
        for side in (0, 1):  # the earliest times, then the latest
            lanes, ends = {}, {}
            for server, cap in self.servers.items():
                by_ckpt, loads, load_ms = self.ckpts[server][side] if server in self.ckpts else ({}, {}, 0.0)
                lane = Lane(cap, spans.get(server, fallback)[side], ckpt=fleet.get(f"ckpt:{server}"),
                            by_ckpt=by_ckpt, loads=loads, load_ms=load_ms)
                head = times.head.get(server, now)
                prompts = times.in_flight(server)
                unseen = max(0, int(fleet.get(f"busy:{server}", 0)) - len(prompts))  # claimed, not yet watched
                for k in range(len(prompts) + unseen):
                    end = lane.send(now) if k else max(now, head + lane.run_ms)
                    if not k:
                        lane.ends.append(end)
                    if k < len(prompts):
                        ends[prompts[k]] = end
                lanes[server] = lane  # a stopped server's prompts still end; no job is sent to it (``able``)
            bounds.append(simulate(order, lanes, now))
            flights.append(ends)
        low, high = bounds
        ranges = {job: ((int(low[job][0]), int(high[job][0] + SLACK_MS)),
                        (int(low[job][1]), int(high[job][1] + SLACK_MS))) for job in low if job in high}
        running = {job: (int(flights[0][job]), int(flights[1][job] + SLACK_MS)) for job in flights[0]}
        return ranges, running
