"""Every job's Redis work has a budget (ops/bench/budget.py): the deployed path, measured as deployed.

ops/bench/deployed.py starts the Procfile's processes with default settings on a private redis-server,
two simulated ComfyUI servers, and posts the jobs over HTTP, 2 outputs each, with a 10 KiB workflow;
every process it starts it stops by PID. Here each server's cap is above the jobs posted (the bench
runs them at cap 8), so no job parks for a free slot: each step's count is the same for every job
and every run, and the processes' idle work spreads over enough jobs to weigh little.
"""

from __future__ import annotations

from pathlib import Path

from ops.bench import budget
from ops.bench.deployed import run
from pipeline.state import keys

JOBS = 100


def test_a_job_as_deployed_stays_within_its_redis_budget(tmp_path: Path) -> None:
    figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS)
    per_job = {step: n / JOBS for step, n in figures.steps.items()}
    report = ", ".join(f"{step} {n:.1f}" for step, n in sorted(per_job.items(), key=lambda kv: -kv[1]))
    assert figures.commands_per_job <= budget.COMMANDS_PER_JOB, report
    for step, most in budget.STEPS.items():
        assert per_job.get(step, 0) <= most, f"{step}: {per_job.get(step, 0):.2f} > {most} ({report})"
    # each step of a job's own path ran once per job: none was skipped, so none is counted short
    for step in ("admission", "claim", "submit mark", "hand-over", "finish"):
        assert figures.calls[step] == JOBS, (step, figures.calls[step])
    assert figures.calls["charge"] == 0  # each collect claim booked its prompt's cost
    assert figures.calls["outputs"] == 2 * JOBS  # each output recorded right after its copy
    # a prompt's end may be seen twice (its websocket message, then /history): the second collect finds
    # the job taken and writes nothing (2 commands, within the step's figure); every job is collected
    assert figures.calls["collect"] >= JOBS


def test_a_job_with_the_state_in_two_shards_pays_for_its_server_slot_within_budget(tmp_path: Path) -> None:
    """The same path with RECKON_SHARDS=2: each server's cap is held across the shards by a slot of its
    own (pipeline/state/slots.py), taken and given back once per job."""
    keys.use_shards(2)  # this process reads the tenant's counts where the stack writes them
    try:
        figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS, env={"RECKON_SHARDS": "2"})
    finally:
        keys.use_shards(1)
    per_job = {step: n / JOBS for step, n in figures.steps.items()}
    report = ", ".join(f"{step} {n:.1f}" for step, n in sorted(per_job.items(), key=lambda kv: -kv[1]))
    for step, most in {**budget.STEPS, **budget.SHARDED_STEPS}.items():
        assert per_job.get(step, 0) <= most, f"{step}: {per_job.get(step, 0):.2f} > {most} ({report})"
    assert figures.calls["server slot"] >= JOBS  # every claim took its slot first


def test_a_job_whose_tenant_has_a_webhook_pays_for_its_delivery_within_budget(tmp_path: Path) -> None:
    """The same path with an endpoint for ``job.completed``: the run ends when every completion (the
    warm-up job's too) reached the receiver."""
    figures = run(tmp_path, jobs=JOBS, concurrency=8, steps=True, cap=JOBS, webhook=True)
    per_job = {step: n / JOBS for step, n in figures.steps.items()}
    report = ", ".join(f"{step} {n:.1f}" for step, n in sorted(per_job.items(), key=lambda kv: -kv[1]))
    assert figures.commands_per_job <= budget.WEBHOOK_COMMANDS_PER_JOB, report
    for step, most in {**budget.STEPS, **budget.WEBHOOK_STEPS}.items():
        assert per_job.get(step, 0) <= most, f"{step}: {per_job.get(step, 0):.2f} > {most} ({report})"
    assert figures.calls["webhooks"] >= 2 * JOBS  # at least a take and an outcome per delivery
