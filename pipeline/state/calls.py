"""Calling parked jobs to free slots: one shard's unpark (lua/unpark.lua), and, with the state split into
shards, the turns the shards take at a server's slots (docs/fleet.md "Fair dispatch across shards").

Within a shard, the unpark script calls the best parked jobs (class, then finish tag). Across shards no
script sees every shard, so each server's key holds the order they take its slots in
(``keys.server_waiting``: the shards with jobs parked for it, by turn):

- a job that parks for want of a slot records its shard as waiting (lua/slot-wait.lua: first, if it
  was not waiting);
- each call an unpark makes reserves its slot on its server's key at once (``<job id>/call``, for the
  call's ``call_ms``: unlike an attempt's slot a reservation lapses, lua/slot-take.lua), which puts
  its shard's turn behind every other waiting shard's; a call whose slot another shard reserved first is
  taken back (its shard calls it again later), so a shard calls nobody for a slot it will not get;
- the step that gives a slot back reads that server's waiting shards (``ServerSlots.release``), and
  ``after_free`` unparks them lowest turn first, then the freeing job's own shard: the first to reserve
  the slot has it, so the shards with waiting jobs take the slots in turn, each fair within itself;
  a listed shard with nothing parked any more leaves the list.
"""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.settings import DEFAULT_BATCH_MAX_WAIT_SECONDS
from pipeline.state import keys
from pipeline.state.scripts import Scripts
from pipeline.state.slots import ServerSlots
from pipeline.state.sweeps import at

#: How long an unparked job's slot waits for its claim (ms): its message crosses the broker in
#: milliseconds; past this it is taken for lost (the sweeper's redelivery sends the job again).
CALL_MS = 10_000


class Calls:
    """Unparks of the state's shards: one (``unpark``), after a freed slot (``after_free``), all (``sweep``)."""

    def __init__(self, client: Any, scripts: Scripts, slots: ServerSlots) -> None:
        self.redis, self.scripts, self.slots = client, scripts, slots
        #: Where the next ``sweep`` starts among the shards.
        self.start = 0

    def unpark(self, shard: keys.ShardKeys, servers: Mapping[str, int], *, call_ms: int = CALL_MS,
               batch_wait_ms: int = DEFAULT_BATCH_MAX_WAIT_SECONDS * 1000,
               now_ms: int | None = None) -> tuple[list[str], int]:
        """The jobs the shard's unpark called (with shards, only those whose slot was reserved), and how
        many jobs wait parked in the shard."""
        reply = self.scripts("unpark", [shard.fleet, shard.parked, shard.called, shard.queue, shard.parked_any,
                                        *map(shard.parked_on, servers)],
                             [at(now_ms), call_ms, batch_wait_ms, *self.slots.unpark_args(servers)])
        calls = list(zip(reply[2::2], reply[3::2], strict=True))
        if not self.slots.on:
            return [job_id for job_id, _ in calls], int(reply[1])
        kept, lost = [], []
        for job_id, server in calls:
            reserved = self.slots.take(server, servers[server], f"{job_id}/call", shard=shard.n, call_ms=call_ms)
            (kept if reserved else lost).append(job_id)
        if lost:  # another shard's call reserved the slot first: these are called again later
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrem(shard.called, *lost)
            pipe.hdel(shard.fleet, *[f"c:{job_id}" for job_id in lost])
            pipe.execute()
        return kept, int(reply[1])

    def after_free(self, shard: keys.ShardKeys, parked: int | None, servers: Mapping[str, int], *,
                   batch_wait_ms: int) -> list[str]:
        """After this thread's step gave a slot back (``parked``: the jobs its shard had parked then, None if
        it gave none back): the jobs called, from the shards waiting for the freed server in turn order
        (with shards), then from ``shard``. A listed shard with no job parked leaves the list."""
        waited = self.slots.waited()
        server, waiting = waited if waited else ("", [])
        order = [keys.ShardKeys(n) for n in waiting if n < keys.shard_count()]
        if parked and shard.n not in waiting:
            order.append(shard)
        called: list[str] = []
        done = []
        for each in order:
            jobs, left = self.unpark(each, servers, batch_wait_ms=batch_wait_ms)
            called += jobs
            if each.n in waiting and not left:
                done.append(each.n)
        if done:  # nothing parked there any more: it waits no longer
            self.redis.zrem(keys.server_waiting(server), *done)
        return called

    def sweep(self, servers: Mapping[str, int], *, batch_wait_ms: int) -> list[str]:
        """Every shard's unpark (the sweeper's pass, and a server back in contact), starting one shard
        further each time, so no shard comes first to every slot it finds free. With shards, a shard with
        jobs parked is recorded as waiting for every server (if it was not): a backstop for a job that
        parked without a slot take failing (behind its own shard's parked jobs, or while its class was paused)."""
        shards = keys.shards()
        self.start = (self.start + 1) % len(shards)
        called: list[str] = []
        for shard in shards[self.start:] + shards[:self.start]:
            jobs, left = self.unpark(shard, servers, batch_wait_ms=batch_wait_ms)
            called += jobs
            for name in servers if left and self.slots.on else []:
                self.slots.wait(name, shard.n)
        return called
