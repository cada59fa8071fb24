"""The growth phase of ops/bench/bench.py (opt-in, long): does a job cost more when there is more of everything?

``--growth-tenants`` tenants (10,000) are created first; then, for each of the two backlog sizes of
``--growth-jobs`` (1,000 and 100,000) in turn, that many jobs are admitted in process round-robin over
all the tenants and drained by one worker, as the drain phase does, but with the drain timed once the
first ``--growth-warmup`` jobs have finished (a new worker's first jobs cost more: imports,
connections). The jobs of the first size stay (finished, within retention) while the second runs.
Reported: each per-job cost at both sizes and its change; the issue's target is flat within 15%.
"""

from __future__ import annotations

import time
from typing import Callable

from ops.bench.bench_drain import Phase, Reckon
from ops.bench.bench_report import Row, Section
from ops.bench.benchlib import Bench

#: (measure, its figure from (admission, drain)).
MEASURES: tuple[tuple[str, Callable[[Phase, Phase], float]], ...] = (
    ("admission, Redis CPU per job, µs", lambda admission, drain: admission.redis_us),
    ("admission, machine CPU per job, µs", lambda admission, drain: admission.machine_us),
    ("admission calls/s, in process", lambda admission, drain: admission.rate),
    ("drain, Redis CPU per job, µs", lambda admission, drain: drain.redis_us),
    ("drain, machine CPU per job, µs", lambda admission, drain: drain.machine_us),
    ("drain, jobs/s", lambda admission, drain: drain.rate),
)
#: The largest change from the small backlog to the large one that counts as flat.
FLAT = 0.15


def run(bench: Bench) -> Section:
    args = bench.args
    side = Reckon(bench)
    tenants = [f"g{n}" for n in range(args.growth_tenants)]
    t0 = time.perf_counter()
    side.create_tenants(tenants)
    created_s = time.perf_counter() - t0
    results = []
    for size in args.growth_jobs:
        admission = side.admit(tenants, size, f"growth-{size}")
        results.append((admission, side.drain(size, skip=args.growth_warmup)))
    books = side.books(tenants)
    if books["completed"] != sum(args.growth_jobs) or books["reserved"]:
        raise SystemExit(f"bench: reckon's books after the growth phase are wrong: {books}")
    small, large = args.growth_jobs
    rows = []
    for name, figure in MEASURES:
        before, after = figure(*results[0]), figure(*results[1])
        rows.append(Row(name, before, after, f"within {FLAT:.0%}", abs(after / before - 1) <= FLAT))
    return Section(
        f"growth: {args.growth_tenants:,} tenants, a backlog of {small:,} then of {large:,} jobs",
        notes=[f"{args.growth_tenants:,} tenants created in {created_s:.1f} s; workers -p {args.processes} "
               f"-t {args.threads}; {books['completed']:,} jobs completed, {books['reserved']} still reserved",
               f"each drain timed from when its first {args.growth_warmup} jobs have finished (the worker's warm-up "
               "left out: it would weigh 100 times more on the small backlog)"],
        rows=rows, columns=(f"{small:,} jobs", f"{large:,} jobs"), change=True)
