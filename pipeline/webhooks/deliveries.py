"""The Redis side of webhook deliveries: events become deliveries, deliveries are taken, tried, settled.

An event's message id (the ``webhook-id`` header) is ``msg_<job id>.<seq>``: a job's events are numbered
once across all its attempts, so the id is stable however often the event is sent, and each endpoint that
wants the event gets it under that id. Each step is one script (lua/webhook-*.lua); docs/webhooks.md
tells the whole path.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from pipeline.state import keys, views
from pipeline.state.jobs import iso, job_view
from pipeline.state.keys import ShardKeys, TenantKeys
from pipeline.state.redisconn import on_node
from pipeline.state.scripts import Code
from pipeline.state.store import Store

#: Events fanned out per call (and moved from the outbox after it).
BATCH = 100
#: Exhausted deliveries kept per endpoint, the newest.
EXHAUSTED_KEPT = 10_000
#: Ready endpoints one take reads, the earliest due first.
READY = 100
#: Fields of an outbox event that say which job event it is, not what the event was.
_ROUTING = ("job", "tenant", "type")

#: tenant -> its endpoints (pipeline/webhooks/endpoints.py: JSON-ready dicts)
EndpointsOf = Callable[[str], list[dict[str, Any]]]
#: endpoint -> (free places, until when (Redis ms) its circuit keeps it closed, 0: not), or None: leave it out
Places = Callable[[str], "tuple[int, int] | None"]


@dataclass(frozen=True)
class Taken:
    """One try of a delivery, leased to this process."""

    member: str
    endpoint: str
    message: str
    tenant: str
    job: str
    body: bytes
    attempts: int
    lease: str


@dataclass(frozen=True)
class Took:
    """What one take leased: the deliveries, when the earliest ready endpoint is due next (Redis ms) or None,
    and the tenants whose due deliveries waited for want of a free place of theirs."""

    taken: list[Taken]
    earliest: int | None
    full: list[str]


def message_id(event: dict[str, Any]) -> str:
    return f"msg_{event['job']}.{event['seq']}"


def payload(event: dict[str, Any], job: dict[str, Any] | None) -> bytes:
    """A message body: ``type``, ``timestamp`` (the event's time) and ``data``, the job's public view (as the
    API shows it: no workflow, no provider URL) with the event itself; a job already purged is its id alone."""
    own = {name: value for name, value in event.items() if name not in _ROUTING}
    own["at"] = iso(own["at"])
    data = {**(job or {"id": event["job"]}), "event": own}
    return orjson.dumps({"type": event["type"], "timestamp": iso(event["at"]), "data": data})


@dataclass(frozen=True)
class Backlog:
    """What waits to be sent, over every shard: events not yet fanned out, deliveries kept (pending, and
    exhausted ones kept for redelivery), and how long the earliest due endpoint has waited past its due
    time (seconds; 0 when none is late)."""

    events: int
    kept: int
    oldest_due_seconds: float


def backlog(client: Any) -> Backlog:
    """Redis's clock, then one pipelined read of four commands per shard."""
    seconds, micros = client.time()
    pipe = client.pipeline(transaction=False)
    for shard in keys.shards():
        pipe.llen(shard.webhook_outbox)
        pipe.llen(shard.webhook_taking)
        pipe.hlen(shard.webhook_deliveries)
        pipe.zrange(shard.webhook_ready, 0, 0, withscores=True)
    replies = pipe.execute()
    now = int(seconds) * 1000 + int(micros) // 1000
    events = kept = 0
    oldest = now
    for outbox, taking, held, first in zip(replies[::4], replies[1::4], replies[2::4], replies[3::4], strict=True):
        events, kept = events + outbox + taking, kept + held
        if first:
            oldest = min(oldest, int(first[0][1]))
    return Backlog(events, kept, max(0, now - oldest) / 1000)


class Deliveries:
    """The webhook steps of one process; ``wall`` is this host's clock (s), a seam for tests."""

    def __init__(self, store: Store, *, wall: Callable[[], float] = time.time) -> None:
        self.store, self.redis, self.wall = store, store.redis, wall
        #: Redis's clock minus this host's (ms), as the last take read it (``clock``)
        self.offset = 0.0

    def move_one(self, shard: ShardKeys, block_seconds: float) -> bool:
        """Wait up to ``block_seconds`` for an outbox event, moving it to the taking list (BLMOVE)."""
        return self.redis.blmove(shard.webhook_outbox, shard.webhook_taking, block_seconds, "LEFT", "RIGHT") \
            is not None

    def fan_out(self, shard: ShardKeys, endpoints_of: EndpointsOf) -> int:
        """Fan out the events waiting in the taking list, then move the outbox's next ones there; how many
        events it handled (0: the list was empty). An event whose tenant has no endpoint wanting it (any
        more) is dropped. Each tenant's endpoints are read once per call, after its events were: an
        endpoint added before an event was written gets it, one removed before does not."""
        raws = self.redis.lrange(shard.webhook_taking, 0, BATCH - 1)
        if not raws:
            return 0
        events = [orjson.loads(raw) for raw in raws]
        tenants = {tenant: endpoints_of(tenant) for tenant in dict.fromkeys(event["tenant"] for event in events)}
        wanted = [(event, endpoint) for event in events for endpoint in tenants[event["tenant"]]
                  if event["type"] in endpoint["types"]]
        job_ids = sorted({event["job"] for event, _ in wanted})
        jobs = {record["id"]: job_view(record, outputs)
                for record, outputs in views.jobs_with_outputs(self.redis, job_ids)} if job_ids else {}
        bodies: dict[str, str] = {}
        keys = [shard.webhook_taking, shard.webhook_outbox, shard.webhook_deliveries, shard.webhook_order,
                shard.webhook_ready]
        due: dict[str, int] = {}  # endpoint -> the index (from 1) of its due set in keys
        made = []
        for event, endpoint in wanted:
            message = message_id(event)
            if message not in bodies:
                bodies[message] = payload(event, jobs.get(event["job"])).decode()
            if endpoint["id"] not in due:
                keys.append(shard.webhook_due(endpoint["id"]))
                due[endpoint["id"]] = len(keys)
            made.append({"endpoint": endpoint["id"], "message": message, "job": event["job"], "tenant": event["tenant"],
                         "type": event["type"], "body": bodies[message], "due": due[endpoint["id"]]})
        reply = self.store.scripts("webhook-fanout", keys, [len(raws), orjson.dumps(made), BATCH, *raws])
        return len(raws) if int(reply[0]) == Code.OK else 0

    def take(self, shard: ShardKeys, places: Places, *, most: int, lease_ms: int, window_ms: int,
             tenants: dict[str, int] | None = None, share: int = 1 << 30) -> Took:
        """Take what is due at the ready endpoints, within ``places`` (endpoint -> free places, and until when
        (Redis ms) its circuit keeps it closed, or None to leave it out), each tenant's free places
        (``tenants`` for those with tries in flight, ``share`` for the others) and ``most`` in all. A
        delivery whose last try's outcome was never written and whose ``window_ms`` is over is exhausted."""
        def read(node: Any) -> list[Any]:  # the shard's server: its ready endpoints and its clock, one round trip
            pipe = node.pipeline(transaction=False)
            pipe.zrange(shard.webhook_ready, 0, READY - 1, withscores=True)
            pipe.time()
            return pipe.execute()

        ready, (seconds, micros) = on_node(self.redis, shard.webhook_ready, read)
        self.offset = seconds * 1000 + micros / 1000 - self.wall() * 1000
        now = self.clock()
        args: list[Any] = []
        keys = [shard.webhook_ready, shard.webhook_deliveries, shard.webhook_order]
        for endpoint, score in ready:
            if score > now + 50 or most <= 0:
                break
            given = places(endpoint)
            if given is None:
                continue
            keys += [shard.webhook_due(endpoint), shard.webhook_exhausted(endpoint)]
            args += [endpoint, *given]
        if not args:
            return Took([], (int(ready[0][1]) if ready else None), [])
        reply = self.store.scripts("webhook-take", keys, [lease_ms, secrets.token_hex(6), "", most,
                                                          orjson.dumps(tenants or {}), share, window_ms,
                                                          EXHAUSTED_KEPT, *args])
        taken = []
        for member, raw in zip(reply[4::2], reply[5::2], strict=True):
            d = orjson.loads(raw)
            taken.append(Taken(member, d["endpoint"], d["message"], d["tenant"], d["job"], d["body"].encode(),
                               int(d["attempts"]), d["lease"]))
        return Took(taken, (None if int(reply[2]) < 0 else int(reply[2])), list(reply[3]))

    def clock(self) -> float:
        """Redis's clock (ms), as this host's clock plus the difference the last take saw."""
        return self.wall() * 1000 + self.offset

    def settle(self, shard: ShardKeys, taken: Taken, outcome: str, *, delay_ms: int = 0, error: str = "",
               status: int | None = None, window_ms: int) -> tuple[str | None, bool]:
        """Record a try's outcome (delivered, dropped or retry): (the outcome recorded (a retry past the
        window: exhausted), or None when the lease was no longer this try's; whether the job's next
        delivery to that endpoint became due)."""
        keys = [shard.webhook_due(taken.endpoint), shard.webhook_deliveries, shard.webhook_order,
                shard.webhook_exhausted(taken.endpoint), shard.webhook_ready]
        reply = self.store.scripts("webhook-done", keys, [
            taken.member, taken.lease, outcome, delay_ms, error[:200], window_ms, EXHAUSTED_KEPT,
            "" if status is None else status])
        if int(reply[0]) != Code.OK:
            return None, False
        return reply[1], reply[2] == 1

    def exhausted(self, tenant: str, endpoint: str, limit: int = 100) -> list[dict[str, Any]]:
        """The endpoint's exhausted deliveries, newest first: what was sent, when, and what went wrong."""
        shard = TenantKeys(tenant).shard
        messages = self.redis.zrevrange(shard.webhook_exhausted(endpoint), 0, limit - 1)
        if not messages:
            return []
        raws = self.redis.hmget(shard.webhook_deliveries, [f"{endpoint}/{m}" for m in messages])
        rows = []
        for raw in raws:
            if raw is None:
                continue
            d = orjson.loads(raw)
            if d.get("state") != "exhausted":
                continue  # redelivered between the two reads
            rows.append({"id": d["message"], "type": d["type"], "job_id": d["job"], "attempts": d["attempts"],
                         "first_attempt_at": iso(d["first_at"]), "exhausted_at": iso(d["exhausted_at"]),
                         "last_status": d.get("last_status"), "last_error": d.get("last_error")})
        return rows

    def redeliver(self, tenant: str, endpoint: str, messages: list[str] | None = None) -> int:
        """Make exhausted deliveries to ``endpoint`` due now (all of them, up to 10,000, when ``messages`` is
        None); how many."""
        shard = TenantKeys(tenant).shard
        if messages is None:
            messages = self.redis.zrange(shard.webhook_exhausted(endpoint), 0, EXHAUSTED_KEPT - 1)
        if not messages:
            return 0
        reply = self.store.scripts("webhook-redeliver", [
            shard.webhook_exhausted(endpoint), shard.webhook_deliveries, shard.webhook_due(endpoint),
            shard.webhook_ready], [endpoint, *messages])
        return int(reply[1])
