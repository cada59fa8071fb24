"""A server's cap across shards: one key of slot leases per server (``keys.server_slots``).

With one shard (the default) a claim takes its slot in the shard's fleet hash, in the claim script
itself, and that is the whole truth. With ``RECKON_SHARDS`` > 1 each shard's fleet hash sees only its
own claims, so a claim first takes a slot here (lua/slot-take.lua), then claims the job with that one
server (the claim script takes the shard's own count too). The two steps are on two Cluster slots;
each crash window between them is closed:

- taken, and the claim never ran (the worker died): the slot's lease lapses (``LEASE_MS``), and
  the sweeper frees it sooner, ``GRACE_MS`` after the take, as no job holds it (``keep``);
- the claim found nothing to run, or parked the job: the worker gives the slot back at once;
- claimed, the slot freed meanwhile (the worker stalled past the grace): the worker confirms the
  slot after its claim (``confirm``) and gives the attempt back, before anything is sent, if it is gone.

So no prompt is sent without its slot. A held slot is renewed by the sweeper while the job's record
says it holds it (``keep``, each pass), and given back when the job gives back its shard slot
(finish, retry, review: ``give``; the sweeper frees any a crash left behind).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

import redis

from pipeline import faultpoints
from pipeline.claims import Claim
from pipeline.state import keys
from pipeline.state.scripts import Scripts

log = logging.getLogger(__name__)

#: A slot's lease: renewed by every sweeper pass while its job holds it, so this only bounds how long a
#: slot outlives every sweeper.
LEASE_MS = 60_000
#: How long a taken slot may wait for its claim before the sweeper frees it.
GRACE_MS = 5_000
#: How often the sweeper renews and frees slots (``keep``): well within a lease and about the grace.
KEEP_EVERY_MS = 5_000


class ServerSlots:
    """The slot leases of the fleet's servers; ``on`` only when the state is split into shards."""

    def __init__(self, client: Any, scripts: Scripts) -> None:
        self.redis, self.scripts = client, scripts
        self.turn = 0

    @property
    def on(self) -> bool:
        return keys.shard_count() > 1

    def take(self, server: str, cap: int, job_id: str) -> int:
        """1: taken; 2: the job held it already (its claim, or one that died: renewed); 0: full."""
        return int(self.scripts("slot-take", [keys.server_slots(server)], [cap, job_id, LEASE_MS])[1])

    def confirm(self, server: str, job_id: str) -> bool:
        """Whether the job still holds its slot: asked after the claim, before the send."""
        return self.redis.zscore(keys.server_slots(server), job_id) is not None

    def give(self, server: str, job_id: str, *, quiet: bool = False) -> None:
        """Free the job's slot; ``quiet``: a Redis error is logged, not raised (the sweeper frees a
        slot no job holds: ``keep``)."""
        try:
            self.redis.zrem(keys.server_slots(server), job_id)
        except redis.RedisError:
            if not quiet:
                raise
            log.warning("slot of %s on %s not given back; the sweeper frees it", job_id, server, exc_info=True)

    def claim(self, job_id: str, servers: Mapping[str, int],
              claim: Callable[[Mapping[str, int]], Claim | None]) -> Claim | None:
        """Take a slot on a server the job can run on (its record's ``servers``, else any, and not
        stopped; from a turning offset, so servers share the work), then ``claim`` the job with that server alone; give
        the slot back if the claim took nothing (a duplicate message of a running job finds it not
        queued and takes no slot: the one its job holds stays). With no slot anywhere, the claim script
        parks the job (handed every server at cap 0)."""
        job = keys.JobKeys(job_id)
        stops = [f"{reason}:{name}" for name in servers for reason in keys.SERVER_BLOCKS]
        pipe = self.redis.pipeline(transaction=False)  # one slot (the job's shard): one round trip
        pipe.hmget(job.record, ["state", "servers"])
        pipe.hmget(job.shard.fleet, stops)
        (state, named), marks = pipe.execute()
        stopped = {field.partition(":")[2] for field, mark in zip(stops, marks, strict=True) if mark}
        able = [name for name in servers if name in (named or "").split(",")] or list(servers)
        able = [name for name in able if name not in stopped]  # a stopped server's slot would go unused
        self.turn = (self.turn + 1) % max(1, len(able))
        for name in able[self.turn:] + able[:self.turn] if state == "queued" else []:
            took = self.take(name, servers[name], job_id)
            if not took:
                continue
            faultpoints.reached("after_slot_taken")  # crash tests: the slot is taken, the job not claimed
            taken = claim({name: servers[name]})
            if taken is None and took == 1:  # a slot the job held already is its earlier claim's, or lapses
                self.give(name, job_id)
            return taken
        return claim({name: 0 for name in servers})  # not queued: the script says why; else it parks

    def taken(self, servers: Mapping[str, int]) -> dict[str, int]:
        """Server -> slots taken (a lapsed lease counts until the next take or keep removes it: an unpark
        that reads this calls too few jobs, never too many)."""
        pipe = self.redis.pipeline(transaction=False)
        for name in servers:
            pipe.zcard(keys.server_slots(name))
        return dict(zip(servers, pipe.execute(), strict=True))

    def unpark_args(self, servers: Mapping[str, int]) -> list[Any]:
        """An unpark's servers: name, cap, and with shards the slots free across them (else '')."""
        free = {name: max(0, servers[name] - n) for name, n in self.taken(servers).items()} if self.on else {}
        return [item for name, cap in servers.items() for item in (name, cap, free.get(name, ""))]

    def keep(self, servers: Mapping[str, int]) -> int:
        """The sweeper's step: renew each slot whose job holds it, free the others past the grace and
        the lapsed; how many were freed."""
        freed = 0
        for name in servers:
            holders = self.redis.zrange(keys.server_slots(name), 0, -1)
            pipe = self.redis.pipeline(transaction=False)
            for job_id in holders:
                pipe.hmget(keys.JobKeys(job_id).record, ["server", "slot_held"])
            args: list[Any] = []
            for job_id, (server, held) in zip(holders, pipe.execute(), strict=True):
                args += [job_id, int(server == name and held == "1")]
            reply = self.scripts("slot-keep", [keys.server_slots(name)], [LEASE_MS, GRACE_MS, *args])
            if int(reply[1]):
                log.info("server %s: %s slot(s) no job holds freed", name, reply[1])
            freed += int(reply[1])
        return freed
