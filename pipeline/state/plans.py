"""The dispatch plan clients read: each waiting job's queue position and ETA range, one small hash per shard.

The planner (pipeline/work/planner.py, in the sweeper, once a pass) writes ``ShardKeys.plan`` whole: job id ->
``position,start_lo,start_hi,finish_lo,finish_hi`` (ms on Redis's clock; empty where unknown), and
``d:<server>`` -> the server's measured run time (ms). The hash expires ``TTL_MS`` after its last write, so a
plan is never older than that: a stopped sweeper's plan goes, it is not shown stale.

Reading a job's plan is one HGET (``read``): a bounded cost per request, nothing on the job's own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.state.jobs import iso
from pipeline.state.keys import JobKeys, ShardKeys

#: How long a written plan is shown (ms): several sweeper passes, so one slow pass does not blank it.
TTL_MS = 10_000


@dataclass(frozen=True)
class Plan:
    """One job's place in the plan: ``position`` (queued jobs only), and its start and finish ranges
    (ms), None where unknown (no server it can run on is running, or none has a measured run time)."""

    position: int | None = None
    start: tuple[int, int] | None = None
    finish: tuple[int, int] | None = None

    def pack(self) -> str:
        cells = [self.position, *(self.start or (None, None)), *(self.finish or (None, None))]
        return ",".join("" if cell is None else str(int(cell)) for cell in cells)

    @classmethod
    def unpack(cls, raw: str) -> Plan:
        cells = [int(cell) if cell else None for cell in raw.split(",")]
        position, s_lo, s_hi, f_lo, f_hi = cells
        start = (s_lo, s_hi) if s_lo is not None and s_hi is not None else None
        finish = (f_lo, f_hi) if f_lo is not None and f_hi is not None else None
        return cls(position, start, finish)


def write(client: Any, shard: ShardKeys, plans: dict[str, Plan], run_ms: dict[str, int]) -> None:
    """Replace the shard's plan in one MULTI (DEL, HSET, PEXPIRE: readers see the old plan or the new)."""
    mapping: dict[str, str | int] = {job_id: plan.pack() for job_id, plan in plans.items()}
    mapping.update({f"d:{server}": ms for server, ms in run_ms.items()})
    pipe = client.pipeline(transaction=True)
    pipe.delete(shard.plan)
    if mapping:
        pipe.hset(shard.plan, mapping=mapping)
        pipe.pexpire(shard.plan, TTL_MS)
    pipe.execute()


def read(client: Any, job_id: str) -> Plan | None:
    """The job's plan, or None when the last pass planned nothing for it: one HGET."""
    raw = client.hget(JobKeys(job_id).shard.plan, job_id)
    return Plan.unpack(raw) if raw else None


def _range(span: tuple[int, int] | None) -> dict[str, str | None] | None:
    return {"earliest": iso(span[0]), "latest": iso(span[1])} if span else None


def with_plan(view: dict[str, Any], client: Any) -> dict[str, Any]:
    """Add ``queue`` and ``eta`` to a job's view: a queued job gets both (null until a pass planned it, ``eta``
    null too while no server it can run on runs or has a measured run time), a running job ``eta`` with its
    finish only, any other state neither (no command is sent for it)."""
    state = view["state"]
    if state not in ("queued", "running"):
        return view
    plan = read(client, view["id"])
    if state == "queued":
        view["queue"] = {"position": plan.position} if plan and plan.position is not None else None
        view["eta"] = {"start": _range(plan.start), "finish": _range(plan.finish)} if plan and plan.start else None
    else:
        view["eta"] = {"finish": _range(plan.finish)} if plan and plan.finish else None
    return view
