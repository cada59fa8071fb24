"""The batch starvation bound (lua/_slots.lua ``age_batch``) when parked batch jobs wait for a stopped server:
they hold none of the 16 moved places, and a job past the bound that a usable server can run still goes before
interactive (a review found 16 moved jobs waiting for a paused server stopped the bound for the whole shard).
The parked set through the real unpark.lua on a real redis-server, as tests/pipeline/test_fair_order.py drives
it: no job records (unpark reads none)."""

from __future__ import annotations

import pytest

from pipeline.state import keys
from pipeline.state.store import Store

SHARD = keys.ShardKeys(0)
BOUND_MS = 600_000
SERVERS = {"gpu": 1, "x": 1}


def _now_ms(store: Store) -> int:
    seconds, micros = store.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _unpark(store: Store) -> list[str]:
    return store.unpark(SHARD, SERVERS, batch_wait_ms=BOUND_MS)


def _moved(store: Store) -> list[str]:
    return store.redis.zrangebyscore(SHARD.parked, "-inf", "(0")


def _park(store: Store, stuck: int) -> list[str]:
    """`stuck` batch jobs only server x can run (tags 10, 20, ..., queued 900 s ago), "old" (any server, tag
    5000, queued 700 s ago) and "i" (interactive); both servers busy."""
    now = _now_ms(store)
    only_x = [f"x{i:02}" for i in range(stuck)]
    store.redis.hset(SHARD.fleet, mapping={"busy:gpu": 1, "busy:x": 1, **{f"p:{job_id}": "x|" for job_id in only_x}})
    store.redis.zadd(SHARD.parked, {**{job_id: keys.BATCH_RANK + 10 * (i + 1) for i, job_id in enumerate(only_x)},
                                    "old": keys.BATCH_RANK + 5000, "i": 50})
    store.redis.zadd(SHARD.queue, {**{job_id: keys.BATCH_RANK + now - 900_000 for job_id in only_x},
                                   "old": keys.BATCH_RANK + now - 700_000, "i": now})
    return only_x


@pytest.mark.parametrize("stuck", [16, 40])
def test_a_late_batch_job_goes_before_interactive_while_moved_jobs_wait_for_a_stopped_server(
        store: Store, stuck: int) -> None:
    """x's jobs (the lowest tags) are moved while x is up; x is paused; gpu frees its slot: "old" (waited 700 s
    against a 600 s bound, runnable on gpu) is called, not "i", and x's jobs are back at their tags. When x
    resumes, its jobs are moved again in tag order (15 of them beside "old") and the first is called, not "i"."""
    only_x = _park(store, stuck)
    assert _unpark(store) == []  # both busy: nobody is called
    assert _moved(store) == only_x[:16]  # the 16 lowest tags
    store.redis.hset(SHARD.fleet, mapping={"dispatch_paused:x": _now_ms(store), "busy:gpu": 0})
    assert _unpark(store) == ["old"]
    assert _moved(store) == ["old"]
    assert [store.redis.zscore(SHARD.parked, job_id) for job_id in only_x] == [
        keys.BATCH_RANK + 10 * (i + 1) for i in range(stuck)]
    store.redis.hdel(SHARD.fleet, "dispatch_paused:x")  # x resumes with its slot free; "old" holds gpu's call
    store.redis.hset(SHARD.fleet, "busy:x", 0)
    assert _unpark(store) == ["x00"]
    assert _moved(store) == [*only_x[:15], "old"]


def test_jobs_no_usable_server_can_run_move_nothing_and_are_not_moved(store: Store) -> None:
    """x is paused with its 16 jobs past the bound waiting unmoved, and a batch job within the bound ("young",
    any server) waits too: nothing is moved (the stuck jobs do not keep interactive behind batch), so gpu's free
    slot calls "i"."""
    only_x = _park(store, 16)
    store.redis.zadd(SHARD.parked, {"young": keys.BATCH_RANK + 1})
    store.redis.zadd(SHARD.queue, {"young": keys.BATCH_RANK + _now_ms(store)})
    store.redis.zrem(SHARD.parked, "old")
    store.redis.zrem(SHARD.queue, "old")
    store.redis.hset(SHARD.fleet, mapping={"dispatch_paused:x": _now_ms(store), "busy:gpu": 0})
    assert _unpark(store) == ["i"]
    assert _moved(store) == []
    assert store.redis.zrange(SHARD.parked, 0, -1) == ["i", "young", *only_x]


def _commands(store: Store) -> int:
    """Commands one unpark runs, its own and its script's (INFO commandstats counts those a script calls)."""
    store.redis.config_resetstat()
    _unpark(store)
    stats = store.redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_fcall", "cmdstat_config|resetstat"))


def test_what_ageing_costs_an_unpark_with_jobs_that_cannot_run(store: Store) -> None:
    """Commands per unpark (5 are unpark's own: ZCARD, TIME, the calls' ZREMRANGEBYSCORE, the fleet's HMGET, the
    head's ZRANGE, all slots being taken): 16 moved that can run, 2 more (the overdue, the moved), as before;
    x paused, its 16 moved ones sent back and "old" moved, 12 more (2 of them one ZADD XX per parked index whose
    jobs' scores changed, x's and the any-server one: lua/_waiting.lua ``reindex_parked``); then each unpark while x stays paused, 7
    more (the 16 of x looked past in the queue); with 300 of x, 7 more: 256 looked past, no more."""
    _park(store, 16)
    _unpark(store)
    assert _commands(store) == 5 + 2
    store.redis.hset(SHARD.fleet, "dispatch_paused:x", _now_ms(store))
    assert _commands(store) == 5 + 12
    assert _moved(store) == ["old"]
    assert _commands(store) == 5 + 7
    store.redis.flushdb()
    _park(store, 300)
    store.redis.hset(SHARD.fleet, "dispatch_paused:x", _now_ms(store))
    assert _commands(store) == 5 + 7
    assert _commands(store) == 5 + 7


def test_a_job_moved_by_an_older_version_goes_back_to_the_batch_end_when_its_servers_stop(store: Store) -> None:
    """A job moved by a version before tags were kept (scored by when it was queued, less 1e13) that only paused
    x can run goes back to when it was queued plus 1e13, after every batch job; "old" is moved."""
    _park(store, 0)
    queued = _now_ms(store) - 800_000
    store.redis.hset(SHARD.fleet, mapping={"p:legacy": "x|", "dispatch_paused:x": _now_ms(store)})
    store.redis.zadd(SHARD.parked, {"legacy": queued - keys.BATCH_RANK})
    store.redis.zadd(SHARD.queue, {"legacy": keys.BATCH_RANK + queued})
    assert _unpark(store) == []
    assert store.redis.zrange(SHARD.parked, 0, -1) == ["old", "i", "legacy"]
    assert store.redis.zscore(SHARD.parked, "legacy") == queued + keys.BATCH_RANK
