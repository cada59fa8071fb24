"""ops/bench/busy.py's arithmetic, and the benchmark itself on a tiny configuration.

The tiny run starts the stack as deployed (ops/bench/deployed.py's ``Deployed``: every Procfile process on a
private redis-server) over two simulated servers of 0.05 s prompts, cap 1; every process it starts it
stops by PID.
"""

from __future__ import annotations

from pathlib import Path

from ops.bench.busy import Busy, Result, overlaps, run

SERVERS, DELAY, JOBS = 2, 0.05, 8
#: The physical limit: JOBS prompts of DELAY seconds on SERVERS servers, one prompt at a time each.
LIMIT = -(-JOBS // SERVERS) * DELAY


def test_busy_is_the_executing_time_over_the_servers_times_the_makespan() -> None:
    side = Busy(servers=2, prompts=4, makespan=2.0, executing=3.0)
    assert side.busy == 0.75
    result = Result(2, 0.5, 4, 1, anchor=Busy(2, 4, 1.0, 1.8), reckon=side, idle_ms=[4.0, 9.0, 6.0])
    assert result.ratio == 0.75 / 0.9
    assert (result.idle(50), result.idle(90)) == (6.0, 9.0)
    assert result.row() == "| 2 x 0.5 s | 4 | 1 | 90.0% (1.00 s) | 75.0% (2.00 s) | 0.833 | 6 / 9 ms (3) |"


def test_an_execution_that_starts_before_the_one_before_it_ends_is_an_overlap() -> None:
    assert overlaps([(200, 300), (0, 100), (100, 200)]) == 0  # back to back, in any order
    assert overlaps([(0, 100), (99, 200), (150, 250)]) == 2


def test_a_tiny_run_measures_both_sides_and_the_idle_overhead(tmp_path: Path) -> None:
    result = run(tmp_path, servers=SERVERS, delay=DELAY, jobs=JOBS, cap=1, idle_jobs=2)
    anchor, reckon = result.anchor, result.reckon
    assert anchor is not None and reckon is not None
    # each side's prompts ran once each, one at a time per server (run refuses an overlap): each side
    # took at least the physical limit and executed at least JOBS x DELAY
    assert (anchor.prompts, reckon.prompts) == (JOBS, JOBS)
    assert anchor.makespan >= LIMIT and reckon.makespan >= LIMIT
    assert anchor.executing >= JOBS * DELAY and reckon.executing >= JOBS * DELAY
    assert 0.5 < anchor.busy <= 1 and 0 < reckon.busy <= 1
    assert result.ratio == reckon.busy / anchor.busy
    # an idle job's completion comes after its DELAY of execution, and the two were measured
    assert len(result.idle_ms) == 2 and all(ms > 0 for ms in result.idle_ms)
