"""Every job's Redis work has a budget (ops/bench/budget.py): the deployed path, measured as deployed.

ops/bench/deployed.py starts the Procfile's processes with default settings on a private redis-server,
two simulated ComfyUI servers, and posts the jobs over HTTP, 2 outputs each, with a 10 KiB workflow;
every process it starts it stops by PID. Here each server's cap is above the jobs posted (the bench
runs them at cap 8), so no job parks for a free slot. What a job's own scripts cost is pinned exactly,
call by call (the same for every job and every run, however slow the machine), and their Redis CPU, each
script timed by Redis itself (ops/bench/slowlog.py), within a margin; the rest, which grows
with the time the run lasts (passes, ticks, renewals, rechecks), is bounded per job and per second of
the run (``budget.TIMED_COMMANDS_PER_SECOND``), never pinned.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import redis

from ops.bench import budget
from ops.bench.deployed import Figures, run
from ops.bench.luaprof import instrumented
from ops.bench.slowlog import Profile, Slowlog
from pipeline.state import keys
from pipeline.state.scripts import Scripts

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
    """Commands and Redis CPU: each script of a job's own path is timed by Redis itself (SLOWLOG at 0,
    ops/bench/slowlog.py, which also counts each call's commands as MONITOR would, in a run without
    MONITOR, which slows every call) and costs at most its figure of ``budget.REDIS_US_STEPS`` (its
    median call x its calls a job), all of them together at most ``budget.REDIS_US_PER_JOB``, and each
    its share of that sum (``budget.REDIS_US_SHARES``): a script made heavier fails here though its
    command count stands."""
    figures = run(tmp_path, jobs=JOBS, concurrency=8, cap=JOBS, profile=True)
    pinned(figures, budget.STEPS)
    within_time(figures, budget.COMMANDS_PER_JOB)
    # each step of a job's own path ran once per job: none was skipped, so none is counted short
    for step in ("admission", "claim", "submit mark", "hand-over", "finish"):
        assert figures.calls[step] == JOBS, (step, figures.calls[step])
    assert figures.calls["charge"] == 0  # each collect claim booked its prompt's cost
    assert figures.profile is not None
    per_step = cpu_per_step(figures.profile)
    shown = ", ".join(f"{step} {us:.0f}" for step, us in per_step.items())
    print(f"Redis CPU per job of a job's own scripts: {sum(per_step.values()):.0f} us ({shown})")
    assert set(per_step) == set(budget.REDIS_US_STEPS), shown
    for step, us in per_step.items():
        assert us <= budget.REDIS_US_STEPS[step], f"{step} {us:.0f} > {budget.REDIS_US_STEPS[step]} ({shown})"
    total = sum(per_step.values())
    assert total <= budget.REDIS_US_PER_JOB, shown
    for step, us in per_step.items():  # within one run: what a slower machine leaves as it is
        assert us / total <= budget.REDIS_US_SHARES[step] + budget.SHARE_MARGIN, f"{step} {us / total:.3f} ({shown})"


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


def cpu_per_step(profile: Profile) -> dict[str, float]:
    """Each pinned step's median call (µs) times its calls a job (``CALLS``), from the run's profile."""
    out: dict[str, float] = {}
    for (step, what), cost in profile.costs.items():
        if step in budget.REDIS_US_STEPS and what.endswith(".lua"):
            assert cost.calls >= CALLS.get(step, 1) * JOBS, (step, what, cost.calls)  # every job's (the warm-up's aside)
            out[step] = out.get(step, 0.0) + cost.median * CALLS.get(step, 1)
    return out


def test_the_profile_times_each_script_on_its_own_and_counts_its_commands(redis_client: redis.Redis) -> None:
    """ops/bench/slowlog.py against a real redis-server: a script's own commands (logged before its call,
    by the Lua client) are its own, a Dramatiq call is its verb and queue, any other command its sender's
    step; this tool's own commands are left out, and the log's settings are put back."""
    port = redis_client.connection_pool.connection_kwargs["port"]
    library = "#!lua name=budgettest\nredis.register_function('budgettest_x_store_output', function(keys, args)\n" \
              "  redis.call('SET', keys[1], args[1]); return redis.call('GET', keys[1]) end)\n" \
              "redis.register_function('budgettest_x_finish', function(keys) return redis.call('INCR', keys[1]) end)\n"
    redis_client.function_load(library, replace=True)
    broker = redis.Redis(port=port, client_name="broker-worker")
    worker, watcher = redis.Redis(port=port, client_name="worker"), redis.Redis(port=port, client_name="watcher")
    dispatch = broker.script_load("return redis.call('LPOP', KEYS[1])")
    worker.ping(), watcher.ping()  # connected (HELLO, CLIENT SETNAME) before the log opens, as the stack's are
    try:
        before = redis_client.config_get("slowlog-log-slower-than")
        with Slowlog(port) as log:
            for _ in range(3):
                worker.fcall("budgettest_x_store_output", 1, "k", "v")
            worker.fcall("budgettest_x_finish", 1, "n")
            broker.evalsha(dispatch, 1, "dramatiq", "fetch", "1", "reckon-collect", "7")
            watcher.hget("h", "f")
        assert redis_client.config_get("slowlog-log-slower-than") == before
    finally:
        redis_client.function_delete("budgettest")
        for client in (broker, worker, watcher):
            client.close()
    costs = log.profile().costs
    assert set(costs) == {("outputs", "store-output.lua"), ("finish", "finish.lua"),
                          ("broker: worker", "dispatch.lua fetch reckon-collect"), ("watcher share", "HGET")}
    outputs = costs[("outputs", "store-output.lua")]
    assert (outputs.calls, outputs.sizes, outputs.inner_calls) == (3, Counter({3: 3}), Counter({"set": 3, "get": 3}))
    assert outputs.us == sum(outputs.each) and len(outputs.each) == 3
    assert costs[("broker: worker", "dispatch.lua fetch reckon-collect")].inner_calls == Counter({"lpop": 1})
    calls, sizes = log.profile().scripts()  # what MONITOR would count, Dramatiq's calls aside
    assert (calls, sizes) == (Counter({"outputs": 3, "finish": 1}), {"outputs": Counter({3: 3}), "finish": Counter({2: 1})})


def test_the_lua_profile_times_a_script_and_the_helpers_it_called(redis_client: redis.Redis) -> None:
    """ops/bench/luaprof.py's instrumented library loads, answers as reckon's does, and times the script
    and each helper it called (confirm-publish: the idempotency lookup)."""
    scripts = Scripts(redis_client)
    redis_client.function_load(instrumented(scripts), replace=True)
    try:
        keys = [f"reckon:{{t:a}}:k{i}" for i in range(7)]
        assert scripts("confirm-publish", keys, ["a.0", "", "", "idem", "1", "86400"]) == [0, 0]
        dumped = redis_client.fcall(f"{scripts.library}_prof_dump", 0)
    finally:
        redis_client.function_delete(scripts.library)  # the next test loads reckon's own
    measured = {line.rsplit(" ", 2)[0]: int(line.rsplit(" ", 1)[1]) for line in map(_text, dumped)}
    assert measured["confirm-publish (whole)"] == 1 and measured["confirm-publish (its body)"] == 1
    assert measured["confirm-publish idem_find"] == 1 and "admit (whole)" not in measured


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
