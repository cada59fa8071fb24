"""Every job's Redis work has a budget (ops/bench/budget.py): the deployed path, measured as deployed.

ops/bench/deployed.py starts the Procfile's processes with default settings on a private redis-server,
two simulated ComfyUI servers, and posts the jobs over HTTP, 2 outputs each, with a 10 KiB workflow;
every process it starts it stops by PID. Here each server's cap is above the jobs posted (the bench
runs them at cap 8), so no job parks for a free slot. What a job's own scripts cost is pinned exactly,
call by call (the same for every job and every run, however slow the machine); the rest, which grows
with the time the run lasts (passes, ticks, renewals, rechecks), is bounded per job and per second of
the run (``budget.TIMED_COMMANDS_PER_SECOND``), never pinned.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ops.bench import budget
from ops.bench.deployed import Figures, run
from pipeline.state import keys

JOBS = 100
#: Each step of a job's own path: how many calls a job makes of it (the others: one).
CALLS = {"outputs": 2}


def report(figures: Figures) -> str:
    per_job = {step: n / JOBS for step, n in figures.steps.items()}
    return (f"{figures.commands_per_job:.1f} a job over {figures.window:.1f} s: "
            + ", ".join(f"{step} {n:.1f}" for step, n in sorted(per_job.items(), key=lambda kv: -kv[1])))


def pinned(figures: Figures, steps: dict[str, int]) -> None:
    """Check that each step of a job's own path cost exactly its figure, call by call, and that each
    step a job takes as often as timing makes it cost exactly its figure a call."""
    for step, per_job in steps.items():
        if step in ("collect", "slot release"):
            continue  # below, with the collects and releases of a prompt seen twice
        calls = CALLS.get(step, 1)
        assert figures.sizes.get(step) == Counter({per_job // calls: calls * JOBS}), (step, figures.sizes.get(step))
    assert set(figures.sizes.get("progress", {})) <= {budget.PER_CALL["progress"]}, figures.sizes.get("progress")
    # a prompt's end may be seen twice (its websocket message, then /history): the second collect finds
    # the job taken and writes nothing
    for step in ("collect", "slot release"):
        sizes = Counter(figures.sizes[step])
        sizes.pop(budget.PER_CALL[f"{step} again"], None)
        assert sizes == Counter({steps[step]: JOBS}), (step, figures.sizes[step])


def within_time(figures: Figures, per_job: float, shards: int = 1, more: float = 0) -> None:
    """The whole count: ``per_job`` a job, the time-driven share for each second and shard, and ``more``."""
    most = per_job * JOBS + budget.TIMED_COMMANDS_PER_SECOND * shards * figures.window + more
    assert figures.commands <= most, f"{figures.commands} > {most:.0f} ({report(figures)})"


def test_a_job_as_deployed_stays_within_its_redis_budget(tmp_path: Path) -> None:
    figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS)
    pinned(figures, budget.STEPS)
    within_time(figures, budget.COMMANDS_PER_JOB)
    # each step of a job's own path ran once per job: none was skipped, so none is counted short
    for step in ("admission", "claim", "submit mark", "hand-over", "finish"):
        assert figures.calls[step] == JOBS, (step, figures.calls[step])
    assert figures.calls["charge"] == 0  # each collect claim booked its prompt's cost


def test_a_job_with_the_state_in_two_shards_pays_for_its_server_slot_within_budget(tmp_path: Path) -> None:
    """The same path with RECKON_SHARDS=2: each server's cap is held across the shards by a slot of its
    own (pipeline/state/slots.py), taken and checked once per job; the sweeper's renewals of held slots
    come with time, apart."""
    keys.use_shards(2)  # this process reads the tenant's counts where the stack writes them
    try:
        figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS, env={"RECKON_SHARDS": "2"})
    finally:
        keys.use_shards(1)
    pinned(figures, budget.STEPS)
    # every claim took its slot first (5 commands) and checked it before its send (4)
    assert figures.sizes["server slot"] == Counter({5: JOBS, 4: JOBS}), figures.sizes["server slot"]
    assert figures.steps["server slot"] == budget.SHARDED_STEPS["server slot"] * JOBS
    within_time(figures, budget.SHARDED_COMMANDS_PER_JOB, shards=2)


def test_a_job_whose_tenant_has_a_webhook_pays_for_its_delivery_within_budget(tmp_path: Path) -> None:
    """The same path with an endpoint for ``job.completed``: the run ends when every completion (the
    warm-up job's too) reached the receiver."""
    figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS, webhook=True)
    pinned(figures, {**budget.STEPS, "finish": budget.WEBHOOK_STEPS["finish"]})
    # each delivery's outcome recorded once (the warm-up job's too, if it came after the measure began:
    # its delivery is then paid inside the window, by a job the window does not count);
    # a fan-out or a take may carry several, as timing makes it
    delivered = figures.scripts["webhook-done"]
    assert delivered in (JOBS, JOBS + 1), figures.scripts
    warm_up = budget.WEBHOOK_STEPS["webhooks"] * (delivered - JOBS)
    within_time(figures, budget.WEBHOOK_COMMANDS_PER_JOB, more=warm_up)
    most = budget.WEBHOOK_STEPS["webhooks"] * delivered + budget.WEBHOOK_WAITS_PER_SECOND * figures.window
    assert figures.steps["webhooks"] <= most, f"webhooks {figures.steps['webhooks']} > {most:.0f} ({report(figures)})"
    assert 1 <= figures.scripts["webhook-take"] <= figures.scripts["webhook-done"], figures.scripts
