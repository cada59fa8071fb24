"""ETAs per checkpoint with model loads counted (pipeline/work/planner.py ``checkpoint_times``,
pipeline/work/runclock.py), on a real redis-server: a run clock's warm and load bookkeeping, and exact
ranges from prepared run times and placements."""

from __future__ import annotations

import orjson
from redis import Redis

from pipeline.state import keys
from pipeline.state.plans import Plan
from pipeline.work import runclock
from pipeline.work.planner import GAP_MS, HIGH, LOW, MIN_HEARD, SLACK_MS, Planner
from pipeline.work.runclock import RunClock

SHARD = keys.ShardKeys(0)


def test_a_run_clock_keeps_each_checkpoints_warm_runs_and_loads(redis_client: Redis) -> None:
    """Prompts of c1, c1, c2, c1, none, c1 on server a: the first has no known predecessor (a's runs only),
    the second is warm, c2 after c1 a load, c1 after c2 a load, the one without a checkpoint a's only, and
    c1 after it unknown again (a's only)."""
    now = [100.0]
    clock = RunClock("a", redis_client, lambda: now[0])
    for job, ckpt, seconds in (("j1", "c1", 1.0), ("j2", "c1", 1.5), ("j3", "c2", 4.0), ("j4", "c1", 3.0),
                               ("j5", None, 0.5), ("j6", "c1", 2.0)):
        clock.started(job, ckpt)
        now[0] += seconds
        clock.ended(job)
    clock.flush({})
    raw = redis_client.hgetall(keys.RUN_TIMES)
    assert runclock.parse(raw) == {"a": [1000, 1500, 4000, 3000, 500, 2000]}
    assert runclock.parse_ckpts(raw) == {"a": {"c1": {"warm": [1500], "load": [3000]},
                                               "c2": {"warm": [], "load": [4000]}}}
    assert list(orjson.loads(raw["a|ckpt"])) == ["c2", "c1"]  # the most recently run last (kept: the newest)


def test_a_job_runs_for_its_checkpoints_times_and_a_load_is_added_when_the_server_holds_another(
        redis_client: Redis) -> None:
    """Server a (cap 1, idle, holding c2) runs 1,000 ms prompts overall, c1 warm 2,000 ms with a load of
    5,000 ms (extra 3,000), c2 warm 500 ms with no load heard (extra: the median of a's, 3,000). Parked:
    p1 (c1: a load), p2 (c1: warm), p3 (c2: a load again), p4 (no checkpoint: a's run time, no load).
    Earliest: warm p10 x 0.8 (c1 1,600, c2 400, a 800), load 3,000 x 0.8 = 2,400; latest: p90 x 1.3 + 50
    (c1 2,650, c2 700, a 1,350), load x 1.3 = 3,900, plus 1,500 ms."""
    assert (LOW, HIGH, SLACK_MS, GAP_MS, MIN_HEARD) == (0.8, 1.3, 1_500, 50, 3)
    redis_client.hset(keys.RUN_TIMES, mapping={"a": "1000,1000,1000", "a|ckpt": orjson.dumps({
        "c1": {"warm": [2000, 2000, 2000], "load": [5000]}, "c2": {"warm": [500, 500, 500], "load": []}})})
    redis_client.hset(SHARD.fleet, mapping={"busy:a": 0, "ckpt:a": "c2", "p:p1": "|c1", "p:p2": "|c1",
                                            "p:p3": "|c2"})
    redis_client.zadd(SHARD.parked, {"p1": 10, "p2": 20, "p3": 30, "p4": 40})
    found = Planner(redis_client, {"a": 1}).plan_shard(SHARD, 10_000)
    assert found["p1"] == Plan(0, (10_000, 11_500), (14_000, 18_050))
    assert found["p2"] == Plan(1, (14_000, 18_050), (15_600, 20_700))
    assert found["p3"] == Plan(2, (15_600, 20_700), (18_400, 25_300))
    assert found["p4"] == Plan(3, (18_400, 25_300), (19_200, 26_650))


def test_a_checkpoint_with_too_few_warm_runs_takes_the_servers_and_a_server_holding_it_adds_no_load(
        redis_client: Redis) -> None:
    """c1 has two warm runs heard (fewer than MIN_HEARD): its jobs take a's run times (800 / 1,350) and no
    load's extra is known (none is added); a holds c1 already, so nothing is loaded either way."""
    redis_client.hset(keys.RUN_TIMES, mapping={"a": "1000,1000,1000", "a|ckpt": orjson.dumps({
        "c1": {"warm": [9000, 9000], "load": [20000]}})})
    redis_client.hset(SHARD.fleet, mapping={"busy:a": 0, "ckpt:a": "c1", "p:p1": "|c1"})
    redis_client.zadd(SHARD.parked, {"p1": 10})
    found = Planner(redis_client, {"a": 1}).plan_shard(SHARD, 10_000)
    assert found["p1"] == Plan(0, (10_000, 11_500), (10_800, 12_850))
