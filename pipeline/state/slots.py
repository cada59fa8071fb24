"""A server's cap across shards: one key of slot leases per server (``keys.server_slots``).

With one shard (the default) a claim takes its slot in the shard's fleet hash, in the claim script
itself, and that is the whole truth. With ``RECKON_SHARDS`` > 1 each shard's fleet hash sees only its
own claims, so a claim first takes a slot here for its attempt (member ``<job id>/<operation id>``:
lua/slot-take.lua), then claims the job with that one server (the claim script takes the shard's own
count too). The two steps are on two Cluster slots; each crash window between them is closed
(docs/fleet.md "A server's cap across shards"):

- taken, and the claim never ran (the worker died): the sweeper frees it ``GRACE_MS`` after the take, as
  no attempt holds it (``keep``);
- the claim found nothing to run, or parked the job: the worker gives its attempt's slot back;
- claimed, the slot freed meanwhile (the worker stalled past the grace): the check before the send
  (``confirm``) finds it gone and the attempt goes back before anything is sent; a check that finds it
  renews it, raising its score, and ``keep`` frees a slot only if its score is the one it read.

So no prompt is sent without its slot. An attempt's slot never lapses by its age: it lives while the job's record
names its attempt, or while a review keeps it for a prompt that may still occupy the server (``k:`` in
the shard's fleet hash, until the watcher hears the prompt is gone: ``let_go``), and only the sweeper
frees one, after reading that nobody holds it (``keep``, every KEEP_EVERY_MS): a sweeper stalled for
minutes leaves every slot taken, and never frees a held one. A slot is given back when the attempt
gives back its shard slot (finish, retry, review: ``release``; the sweeper frees any a crash left behind).
A call's reservation (``<job id>/call``: calls.py) is the one slot that lapses: a promise for the call's
length, taken over by the called job's take, removed once lapsed by a take that finds the server full or
by ``keep``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

import orjson
import redis

from pipeline import faultpoints
from pipeline.claims import Claim
from pipeline.fleet import able
from pipeline.state import keys
from pipeline.state.scripts import Scripts

log = logging.getLogger(__name__)

#: How long a taken slot may wait for its claim before the sweeper frees it.
GRACE_MS = 5_000
#: How often the sweeper renews and frees slots (``keep``): about the grace.
KEEP_EVERY_MS = 5_000


class ServerSlots:
    """The slot leases of the fleet's servers; ``on`` only when the state is split into shards."""

    def __init__(self, client: Any, scripts: Scripts) -> None:
        self.redis, self.scripts = client, scripts
        self.turn = 0
        #: Per thread: the server whose slot the last ``release`` gave back and the shards waiting for it
        #: then, in turn order (``waited``).
        self._waited = threading.local()

    @property
    def on(self) -> bool:
        return keys.shard_count() > 1

    def take(self, server: str, cap: int, member: str, *, shard: int | None = None, reserved: str = "",
             call_ms: int | None = None) -> int:
        """1: taken; 2: held already by this attempt (renewed); 0: full. ``member``: ``<job id>/<operation id>``.
        ``reserved``: the reservation of the job's call (``<job id>/call``) to take over; ``call_ms``: this take
        reserves a slot for a call of ``shard``'s for that long (it lapses then, unlike an attempt's slot),
        and the shard's turn goes behind the other waiting shards' (lua/slot-take.lua)."""
        reply = self.scripts("slot-take", [keys.server_slots(server), keys.server_waiting(server)],
                             [cap, member, "" if shard is None else shard, reserved, "" if call_ms is None else call_ms])
        return int(reply[1])

    def confirm(self, server: str, claim: Claim) -> bool:
        """Whether the attempt still holds its slot (renewed, so the sweeper's earlier read cannot free
        it): asked after the claim, before the send."""
        reply = self.scripts("slot-keep", [keys.server_slots(server)], [GRACE_MS, member(claim), 1, ""])
        return reply[2] == 1

    def give(self, server: str, claim: Claim, *, quiet: bool = False) -> list[int]:
        """Free the attempt's slot (only its own: another attempt of the job has another member); the
        shards waiting for the server, lowest turn first, read in the same round trip (calls.py), none if
        the slot was free already (given back when its prompt ended: ``ended``); ``quiet``: a Redis error
        is logged, not raised (the sweeper frees a slot no attempt holds)."""
        pipe = self.redis.pipeline(transaction=False)  # one Cluster slot: the server's hash tag
        pipe.zrem(keys.server_slots(server), member(claim))
        pipe.zrange(keys.server_waiting(server), 0, -1)
        try:
            removed, waiting = pipe.execute()
            return [int(n) for n in waiting] if removed else []
        except redis.RedisError:
            if not quiet:
                raise
            log.warning("slot of %s on %s not given back; the sweeper frees it", claim.job_id, server, exc_info=True)
            return []

    def release(self, held: Claim | None) -> None:
        """After a step that gave the attempt's shard slot back: its server slot too (with shards; a
        Redis error is logged, the sweeper frees it), and the shards then waiting for it (``waited``)."""
        self._waited.last = None
        if held is not None and held.server and self.on:
            self._waited.last = (held.server, self.give(held.server, held, quiet=True))

    def ended(self, claim: Claim) -> int | None:
        """The attempt's prompt ended at its server (``claim``: its job, operation and server, as its watch
        entry names them): its slot is given back now (lua/prompt-ended.lua; with shards its server's key
        too), not once its outputs are collected. The jobs its shard had parked then, None if the slot was
        given back already (or is another attempt's); ``waited`` then says which shards waited for it."""
        job = keys.JobKeys(claim.job_id)
        reply = self.scripts("prompt-ended", [job.record, job.shard.fleet, job.shard.parked], [claim.operation_id])
        self._waited.last = None
        if int(reply[0]) != 0:
            return None
        self.release(claim)
        return int(reply[1])

    def waited(self) -> tuple[str, list[int]] | None:
        """The server whose slot this thread's last ``release`` gave back, and the shards that waited for
        it (lowest turn first); None if it gave none back. Cleared by asking."""
        last, self._waited.last = getattr(self._waited, "last", None), None
        return last

    def claim(self, job_id: str, operation_id: str, servers: Mapping[str, int],
              claim: Callable[[Mapping[str, int]], Claim | None]) -> Claim | None:
        """Take a slot for this attempt (``operation_id``) on a server the job can run on (its record's
        ``servers``, else any, and not stopped; the server its unpark call was promised first, then from a
        turning offset so servers share the work), then ``claim`` the job with that server alone; give
        the slot back and try the next server if the claim took nothing but the job is still queued
        (its slot there is promised to another called job). A duplicate message is another attempt: a
        slot of its own, given back when its claim finds the job running. With no slot anywhere, the
        claim script parks the job (handed every server at cap 0)."""
        job = keys.JobKeys(job_id)
        stops = [f"{reason}:{name}" for name in servers for reason in keys.SERVER_BLOCKS]
        pipe = self.redis.pipeline(transaction=False)  # one slot (the job's shard): one round trip
        pipe.hmget(job.record, ["state", "servers"])
        pipe.hmget(job.shard.fleet, [*stops, f"c:{job_id}"])
        (state, named), marks = pipe.execute()
        shard = job.shard.n
        stopped = {field.partition(":")[2] for field, mark in zip(stops, marks[:-1], strict=True) if mark}
        usable = [name for name in able(servers, named) if name not in stopped]  # a stopped one's slot goes unused
        self.turn = (self.turn + 1) % max(1, len(usable))
        order = sorted(usable[self.turn:] + usable[:self.turn], key=lambda name: name != marks[-1])
        tried, full = 0, []
        for name in order if state == "queued" else []:
            attempt = f"{job_id}/{operation_id}"
            reserved = f"{job_id}/call" if name == marks[-1] else ""  # its call's reservation (calls.py)
            if not self.take(name, servers[name], attempt, reserved=reserved):
                full.append(name)
                continue
            faultpoints.reached("after_slot_taken")  # crash tests: the slot is taken, the job not claimed
            taken = claim({**dict.fromkeys(servers, 0), name: servers[name]})  # that server alone (all indexed)
            if taken is not None:
                return taken
            self.redis.zrem(keys.server_slots(name), attempt)
            tried += 1
            if tried >= 2 or self.redis.hget(job.record, "state") != "queued":
                return None  # not claimable, or parked again: the next unpark calls it
        parked = claim({name: 0 for name in servers})  # not queued: the script says why; else it parks
        for name in full if parked is None else []:  # parked: its shard waits for them (calls.py)
            self.wait(name, shard)
        return parked

    def wait(self, server: str, shard: int) -> None:
        """Record ``shard`` as waiting for ``server``'s slots (first if it was not: lua/slot-wait.lua). After
        a park, so an unpark that found the shard's parked set empty just before (and took it off the
        list) does not leave the parked job out of the turns."""
        self.scripts("slot-wait", [keys.server_waiting(server)], [shard])

    def taken(self, servers: Mapping[str, int]) -> dict[str, int]:
        """Server -> slots taken (one nobody holds, or a lapsed reservation, counts until the sweeper or a take
        frees it: an unpark that reads this calls too few jobs, never too many)."""
        pipe = self.redis.pipeline(transaction=False)
        for name in servers:
            pipe.zcard(keys.server_slots(name))
        return dict(zip(servers, pipe.execute(), strict=True))

    def unpark_args(self, servers: Mapping[str, int]) -> list[Any]:
        """An unpark's servers: name, cap, and with shards the slots free across them (else '')."""
        free = {name: max(0, servers[name] - n) for name, n in self.taken(servers).items()} if self.on else {}
        return [item for name, cap in servers.items() for item in (name, cap, free.get(name, ""))]

    def keep(self, servers: Mapping[str, int]) -> int:
        """The sweeper's step: renew each slot an attempt or a review holds, free the others past the grace
        (only if unchanged since read); how many were freed. Never frees a slot by its age alone."""
        freed = 0
        for name in servers:
            held = self.redis.zrange(keys.server_slots(name), 0, -1, withscores=True)
            holds = self._held(name, [slot for slot, _ in held])
            args = [item for (slot, score), on in zip(held, holds, strict=True) for item in (slot, int(on), int(score))]
            reply = self.scripts("slot-keep", [keys.server_slots(name)], [GRACE_MS, *args])
            if int(reply[1]):
                log.info("server %s: %s slot(s) no attempt holds freed", name, reply[1])
            freed += int(reply[1])
        return freed

    def _held(self, name: str, slots: list[str]) -> list[bool]:
        """Whether each slot (``<job id>/<operation id>``) of server ``name`` is held: its job's record names
        the attempt, or, read only for those it does not, a review keeps it (``k:`` in the fleet hash)."""
        pipe = self.redis.pipeline(transaction=False)
        for slot in slots:
            pipe.hmget(keys.JobKeys(slot.partition("/")[0]).record, ["server", "slot_held", "operation_id"])
        holds = [server == name and on == "1" and slot.partition("/")[2] == operation
                 for slot, (server, on, operation) in zip(slots, pipe.execute(), strict=True)]
        loose = [slot for slot, on in zip(slots, holds, strict=True) if not on]
        for slot in loose:
            pipe.hexists(keys.JobKeys(slot.partition("/")[0]).shard.fleet, f"k:{slot}")
        kept = {slot for slot, on in zip(loose, pipe.execute() if loose else [], strict=True) if on}
        return [on or slot in kept for slot, on in zip(slots, holds, strict=True)]

    def let_go(self, slot: str, server: str, *, completed: bool = False) -> bool:
        """Give back the slot a review kept for a prompt that is gone now (``<job id>/<operation id>``, on
        ``server``): its shard's count, then (with shards) its server's key; False if it was not kept (any
        more: a second call changes nothing). ``completed``: the server says the prompt completed, so the
        hold its review left uncertain is booked as charged (lua/slot-let-go.lua). One that dies between
        the two steps leaves the server's key to the sweeper (nothing holds that slot any more: freed
        after the grace)."""
        job = keys.JobKeys(slot.partition("/")[0])
        given = self.scripts("slot-let-go", [job.shard.fleet, job.record, job.tenant.ledger, *job.shard.globals],
                             [slot, int(completed)])[1]
        if self.on:
            self.redis.zrem(keys.server_slots(server), slot)
        return bool(given)

    def forget(self, server: str) -> list[str]:
        """An operator's word that ``server`` is gone for good (``reckon provider forget``): every slot a
        review kept there is given back, its hold left uncertain (nobody can say what ran). The slots kept
        given back (``<job id>/<operation id>``). No process frees one from its own settings: a watcher
        not yet restarted with a server just added cannot tell it from one removed."""
        freed = []
        for shard in keys.shards():
            for field, raw in self.redis.hscan_iter(shard.fleet, match="k:*"):
                if orjson.loads(raw)["server"] == server and self.let_go(field[2:], server):
                    freed.append(field[2:])
        return freed

def member(claim: Claim) -> str:
    """An attempt's slot member: its job and its operation id."""
    return f"{claim.job_id}/{claim.operation_id}"
