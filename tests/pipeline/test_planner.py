"""Queue positions and ETA ranges (pipeline/work/planner.py, pipeline/state/plans.py) on a real redis-server:
positions over jobs parked by the real admission and claim scripts, ETAs from run times the planner measured
itself, a paused server, the fields per state, and the commands a pass costs over a backlog of thousands."""

from __future__ import annotations

import orjson
from redis import Redis

from pipeline.settings import Settings
from pipeline.state import keys, plans
from pipeline.state.plans import Plan
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant, set_limits
from pipeline.work import runclock
from pipeline.work.planner import GAP_MS, HIGH, LOW, SLACK_MS, Planner
from pipeline.work.runclock import FLUSH_SECONDS, RunClock

SHARD = keys.ShardKeys(0)
SERVERS = {"a": 1, "b": 1}


def _submit(admitter: Admitter, store: Store, tenant: str, key: str, priority: str, only: str = "") -> str:
    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 1, "priority": priority}
    job_id = admitter.submit(tenant, key, body).job_id
    if only:  # only these servers can run it (routing writes this field at admission)
        store.redis.hset(keys.JobKeys(job_id).record, "servers", only)
    store.claim(job_id, worker="w", lease_ms=600_000, operation_id=job_id, servers=SERVERS)
    return job_id


def test_positions_follow_dispatch_order_and_count_only_jobs_that_compete_for_the_same_servers(
        store: Store, settings: Settings) -> None:
    """Two servers held; tenants ta (weight 1) and tb (weight 2) park batch and interactive jobs, one of tb's
    only server b can run, one of ta's only server a. Interactive go first, then by tag; a job counts the jobs
    ahead of it that can use one of its servers: the a-only job does not count the b-only one."""
    admitter = Admitter(store, lambda job_id, priority: None, settings)
    for name, weight in (("tz", 1.0), ("ta", 1.0), ("tb", 2.0)):
        create_tenant(store.redis, name, 10**9)
        set_limits(store.redis, name, weight=weight)
    for i in range(2):  # they take both slots
        assert store.redis.hget(keys.JobKeys(_submit(admitter, store, "tz", f"z{i}", "interactive")).record,
                                "state") == "running"
    b1, b2, b3 = (_submit(admitter, store, "ta", f"b{i}", "batch") for i in range(3))
    b4 = _submit(admitter, store, "tb", "b4", "batch")
    i1, i2 = (_submit(admitter, store, "ta", f"i{i}", "interactive") for i in range(2))
    x = _submit(admitter, store, "tb", "x", "interactive", only="b")
    y = _submit(admitter, store, "ta", "y", "interactive", only="a")
    order = store.redis.zrange(SHARD.parked, 0, -1)
    assert order == [x, i1, i2, y, b4, b1, b2, b3]  # fair order: tb's weight halves its tags
    found = Planner(store.redis, SERVERS).plan_shard(SHARD, 1_000)
    assert {job: found[job].position for job in order} == {x: 0, i1: 1, i2: 2, y: 2, b4: 4, b1: 5, b2: 6, b3: 7}
    assert all(found[job].start is None for job in order)  # no run time measured yet: positions only
    assert plans.read(store.redis, y) == Plan(2)


def _fleet(client: Redis, watched: dict[str, str], busy: dict[str, int]) -> None:
    """The fleet hash as the scripts leave it: watched prompts (job -> server) and slots in use."""
    client.delete(SHARD.fleet)
    client.hset(SHARD.fleet, mapping={**{f"busy:{s}": n for s, n in busy.items()},
                                      **{f"w:{job}": orjson.dumps({"server": s}) for job, s in watched.items()}})


def _measured(client: Redis) -> Planner:
    """A planner that watched a run 2 s on server a and 4 s on server b, with one prompt on each now (j3 on a
    since 2,000 ms, j4 on b since 4,000 ms), at 4,000 ms."""
    planner = Planner(client, SERVERS)
    for now, watched in ((0, {"j1": "a", "j2": "b"}), (2_000, {"j3": "a", "j2": "b"}),
                         (4_000, {"j3": "a", "j4": "b"})):
        _fleet(client, watched, {"a": 1, "b": 1})
        planner.plan_shard(SHARD, now)
    assert client.hmget(SHARD.plan, ["d:a", "d:b"]) == ["2000", "4000"]
    return planner


def test_etas_follow_the_measured_run_times_and_the_prompts_running(redis_client: Redis) -> None:
    """a runs 2 s, b 4 s, each has one prompt running (j3 on a since 2,000 ms, j4 on b since 4,000 ms), at
    4,000 ms. Earliest: run times x 0.8 (a 1,600, b 3,200); latest: x 1.3 (a 2,600, b 5,200) plus 1,500 ms.
    p1 and p2 go to a after j3, p3 to b after j4 (b's slot frees first, or as soon as a's and b has less)."""
    assert (LOW, HIGH, SLACK_MS) == (0.8, 1.3, 1_500)  # the figures below are worked out with these
    planner = _measured(redis_client)
    redis_client.zadd(SHARD.parked, {"p1": 10, "p2": 20, "p3": 30})
    found = planner.plan_shard(SHARD, 4_000)
    assert found["j3"] == Plan(finish=(4_000, 6_100))  # earliest: ended by now (2,000 + 1,600)
    assert found["j4"] == Plan(finish=(7_200, 10_700))
    assert found["p1"] == Plan(0, (4_000, 6_100), (5_600, 8_700))
    assert found["p2"] == Plan(1, (5_600, 8_700), (7_200, 11_300))
    assert found["p3"] == Plan(2, (7_200, 10_700), (10_400, 15_900))
    assert Plan.unpack(redis_client.hget(SHARD.plan, "p3")) == found["p3"]


def test_a_paused_server_takes_no_job_in_the_plan_and_a_job_only_it_can_run_gets_no_eta(
        store: Store, redis_client: Redis) -> None:
    """Server b paused: its running prompt still gets a finish, every parked job is planned on a, one after
    the other, and the job only b can run keeps its position, without an ETA; resumed, b takes jobs again."""
    planner = _measured(redis_client)
    redis_client.zadd(SHARD.parked, {"p1": 10, "p2": 20, "p3": 30, "only-b": 40})
    redis_client.hset(SHARD.fleet, "p:only-b", "b|")
    store.block_provider("b", "dispatch_paused")
    found = planner.plan_shard(SHARD, 4_000)
    assert found["j4"] == Plan(finish=(7_200, 10_700))
    assert [found[p] for p in ("p1", "p2", "p3")] == [
        Plan(0, (4_000, 6_100), (5_600, 8_700)), Plan(1, (5_600, 8_700), (7_200, 11_300)),
        Plan(2, (7_200, 11_300), (8_800, 13_900))]
    assert found["only-b"] == Plan(3)
    store.clear_provider("b")
    found = planner.plan_shard(SHARD, 4_000)
    assert found["p3"] == Plan(2, (7_200, 10_700), (10_400, 15_900))
    assert found["only-b"] == Plan(3, (10_400, 15_900), (13_600, 21_100))


def test_the_view_shows_the_plan_by_state(store: Store, redis_client: Redis) -> None:
    """Queued: ``queue`` and ``eta`` (null until planned); running: ``eta`` with its finish only; finished:
    neither, and no command is sent for them."""
    at = 1_800_000_000_000
    q, r, new = (f"acme.{n:020x}" for n in range(3))
    plans.write(redis_client, SHARD, {q: Plan(3, (at, at + 1000), (at + 2000, at + 4000)),
                                     r: Plan(finish=(at, at + 500))}, {"a": 2000})
    queued = plans.with_plan({"id": q, "state": "queued"}, redis_client)
    assert queued["queue"] == {"position": 3}
    assert queued["eta"] == {"start": {"earliest": "2027-01-15T08:00:00.000Z", "latest": "2027-01-15T08:00:01.000Z"},
                             "finish": {"earliest": "2027-01-15T08:00:02.000Z", "latest": "2027-01-15T08:00:04.000Z"}}
    assert plans.with_plan({"id": r, "state": "running"}, redis_client) == {
        "id": r, "state": "running",
        "eta": {"finish": {"earliest": "2027-01-15T08:00:00.000Z", "latest": "2027-01-15T08:00:00.500Z"}}}
    assert plans.with_plan({"id": new, "state": "queued"}, redis_client) == {
        "id": new, "state": "queued", "queue": None, "eta": None}
    before = redis_client.info("stats")["total_commands_processed"]
    assert plans.with_plan({"id": q, "state": "completed"}, redis_client) == {"id": q, "state": "completed"}
    assert redis_client.info("stats")["total_commands_processed"] == before + 1  # the INFO itself
    assert 0 < redis_client.pttl(SHARD.plan) <= plans.TTL_MS


def _commands(client: Redis) -> int:
    return sum(v["calls"] for k, v in client.info("commandstats").items() if k != "cmdstat_info")


def test_a_pass_over_thousands_of_parked_jobs_costs_the_same_few_commands(redis_client: Redis) -> None:
    """3,000 parked jobs, a third only server a can run: a pass is 3 reads in one round trip and the plan's
    MULTI (DEL, HSET, PEXPIRE), 8 commands; idle (nothing parked or watched, the empty plan written) 3."""
    planner = _measured(redis_client)
    redis_client.zadd(SHARD.parked, {f"p{i:04}": i for i in range(3_000)})
    redis_client.hset(SHARD.fleet, mapping={f"p:p{i:04}": "a|" for i in range(0, 3_000, 3)})
    before = _commands(redis_client)
    found = planner.plan_shard(SHARD, 4_000)
    assert _commands(redis_client) - before == 8
    assert len(found) == 3_000 + 2 and found["p2999"].position == 2_999 and found["p2999"].start is not None
    assert redis_client.hlen(SHARD.plan) == 3_000 + 2 + 2  # and the two run times
    redis_client.delete(SHARD.parked)
    _fleet(redis_client, {}, {"a": 0, "b": 0})
    planner.plan_shard(SHARD, 5_000)  # writes the empty plan: the old one goes
    assert redis_client.hkeys(SHARD.plan) == ["d:a", "d:b"]  # the run times stay until the key expires
    before = _commands(redis_client)
    planner.plan_shard(SHARD, 6_000)
    assert _commands(redis_client) - before == 3


def test_run_times_heard_by_the_watchers_set_the_ranges(redis_client: Redis) -> None:
    """Ten run times heard on a (1,000 ms, one 4,000) and three on b (3,000 ms): p10 and p90 of each, x 0.8 and
    x 1.3 + 50 ms; two servers idle, so p1 starts now on a and p2 now on b, p3 after p1 on a."""
    assert (LOW, HIGH, SLACK_MS, GAP_MS) == (0.8, 1.3, 1_500, 50)
    redis_client.hset(keys.RUN_TIMES, mapping={"a": ",".join(["1000"] * 9 + ["4000"]), "b": "3000,3000,3000"})
    redis_client.zadd(SHARD.parked, {"p1": 10, "p2": 20, "p3": 30})
    found = Planner(redis_client, SERVERS).plan_shard(SHARD, 10_000)
    assert found["p1"] == Plan(0, (10_000, 11_500), (10_800, 12_850))  # a's p90 of ten is its 9th: 1,000
    assert found["p2"] == Plan(1, (10_000, 11_500), (12_400, 15_450))
    assert found["p3"] == Plan(2, (10_800, 12_850), (11_600, 14_200))
    assert redis_client.hmget(SHARD.plan, ["d:a", "d:b"]) == ["1000", "3000"]


def test_a_run_clock_keeps_the_run_times_it_heard_and_writes_them_at_most_every_five_seconds(
        redis_client: Redis) -> None:
    now = [100.0]
    clock = RunClock("a", redis_client, lambda: now[0])
    clock.started("j1")
    now[0] += 1.25
    clock.ended("j1")
    clock.ended("j1")  # heard twice (websocket, then /history): one run time
    clock.ended("j2")  # its start unheard: none
    clock.flush({})
    assert runclock.parse(redis_client.hgetall(keys.RUN_TIMES)) == {"a": [1250]}
    clock.started("j3")
    clock.started("gone")
    now[0] += 0.5
    clock.ended("j3")
    clock.flush({"j3": {}})  # within FLUSH_SECONDS: not written yet; the start of a prompt no longer watched goes
    assert redis_client.hget(keys.RUN_TIMES, "a") == "1250" and set(clock.begun) == set()
    now[0] += FLUSH_SECONDS
    clock.flush({})
    assert redis_client.hget(keys.RUN_TIMES, "a") == "1250,500"
