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


def test_each_gap_is_cut_at_the_traced_points_and_a_gap_sent_otherwise_counts_apart(tmp_path: Path) -> None:
    from ops.bench.gaps import gaps, read_trace

    trace = tmp_path / "trace.log"
    trace.write_text("\n".join([
        "1001 heard p1 9 w", "1001.5 released p1 9 w", "1002 thread acme.b 9 d", "1003 claimed acme.b p2 9 d",
        "1003.5 staged p2 9 d", "1004 post p2 9 d", "1004.5 posted p2 9 d",
        "2001 heard p2 9 w", "2001.5 released p2 9 w",  # p3 was claimed by a worker, its thread untraced
        "2900 claimed acme.c p3 8 t", "2901 staged p3 8 t", "2902 post p3 8 t"]))
    whole, parts = gaps({"p1": (0, 1000), "p2": (1005, 2000), "p3": (2903, 3000)}, read_trace(trace))
    assert whole == [5, 903]
    assert {name: values for name, values in parts.items()} == {
        "heard": [1], "released": [0.5], "thread": [0.5], "claimed": [1], "staged": [0.5], "post": [0.5],
        "start": [1], "other": [903]}
