"""Typed access to reckon's Redis state: one method per Lua script; plain reads come from ``Reads``."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Mapping

import orjson
import redis
from redis.exceptions import RedisClusterException

from pipeline.claims import Claim, Collect, Inputs, Reconcile
from pipeline.errors import (
    CancelRequested,
    DeadlineExceeded,
    DispatchPaused,
    WrongShards,
)
from pipeline.settings import (
    DEFAULT_IDEMPOTENCY_TTL_SECONDS,
    DEFAULT_BATCH_MAX_WAIT_SECONDS,
    Settings,
)
from pipeline.state import keys, redisconn
from pipeline.state.admits import Admission, Admits  # noqa: F401 (Admission: imported from here)
from pipeline.state.bookings import Bookings
from pipeline.state.keys import JobKeys
from pipeline.state.scripts import Code, ReplicationTimeout, Scripts
from pipeline.state.calls import CALL_MS, Calls
from pipeline.state.slots import ServerSlots
from pipeline.state.sweeps import at

log = logging.getLogger(__name__)

#: How long a process starting waits for Redis to answer (s) before it gives up.
STARTUP_WAIT_S = 30.0


def open_store(settings: Settings, *, check: bool = True, wait_s: float = STARTUP_WAIT_S) -> Store:
    """A process's store: its client (one server, Sentinel or Cluster, ``redisconn.connect``), the
    scripts with the settings' durability, and the shard count, checked against the one the state
    records unless ``check`` is False (the API checks it at readiness). Redis not answering (not up
    yet, a failover under way) is waited for up to ``wait_s``; a wrong count is refused at once."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client = redisconn.connect(settings)  # a RedisCluster asks its nodes for the slots right away
            store = Store(client, Scripts.of(client, settings), shards=settings.shards,
                          retention_ms=settings.retention_seconds * 1000, idem_ttl_s=settings.idempotency_ttl_seconds)
            if check:
                store.check_shards()
            return store
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _overrun(claim: Claim, units: int, over: int) -> None:
    """A charge beyond what the job held: booked in full all the same (the money was spent), logged."""
    log.error("charge overrun: job %s attempt %d on server %s charged %d units, %d more than it held",
              claim.job_id, claim.attempt, claim.server, units, over)


class Store(Admits, Bookings):
    """Every write is one Lua script; ``now_ms`` arguments default to Redis's own clock."""

    def __init__(self, client: redis.Redis, scripts: Scripts | None = None, *, shards: int | None = None,
                 retention_ms: int | None = None, idem_ttl_s: int = DEFAULT_IDEMPOTENCY_TTL_SECONDS) -> None:
        """``shards``: the deployment's shard count (``RECKON_SHARDS``), set for the whole process;
        None leaves the count as it is (1 unless set). ``retention_ms``: how long a finished job is
        kept (``RECKON_RETENTION_SECONDS``): its tenant is woken for the sweeper's purge then, not
        when it finishes (None: at once). ``idem_ttl_s``: ``RECKON_IDEMPOTENCY_TTL_SECONDS``."""
        self.retention, self.idem_ttl_s = "" if retention_ms is None else retention_ms, idem_ttl_s
        #: Typed Any: the client decodes replies to str, which redis-py's stubs cannot express.
        self.redis: Any = client
        self.scripts = scripts or Scripts(client)
        #: A server's slots across shards (used only with more than one shard).
        self.slots = ServerSlots(client, self.scripts)
        self.calls = Calls(client, self.scripts, self.slots)
        self._shards_checked = False
        #: Per thread: the parked jobs the last step that gave a dispatch slot back saw (``freed``).
        self._freed = threading.local()
        if shards is not None:
            keys.use_shards(shards)

    def freed(self) -> int | None:
        """Jobs parked in its shard, as seen by the last finish, retry or review this thread made
        since it last asked (each gives back a dispatch slot); None when it made none. Cleared by
        asking: a worker asks after each message, to publish parked jobs only when a slot freed
        while some waited."""
        parked, self._freed.parked = getattr(self._freed, "parked", None), None
        return parked

    def check_shards(self) -> None:
        """Record the shard count on first use; refuse (WrongShards) a count other than the recorded
        one: tenants would be looked for in the wrong shards."""
        if self._shards_checked:  # a recorded count never changes: readiness probes need not write again
            return
        meta = keys.ShardKeys(0).meta
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(meta, "shards", keys.shard_count())
        pipe.hget(meta, "shards")
        recorded = int(pipe.execute()[1])
        if recorded != keys.shard_count():
            raise WrongShards(f"RECKON_SHARDS is {keys.shard_count()} but this Redis holds {recorded} shards")
        self._shards_checked = True

    # -- writes (each one Lua script) ---------------------------------------------

    def claim(
        self, job_id: str, *, worker: str, lease_ms: int, operation_id: str, servers: Mapping[str, int],
        prices: Mapping[str, int] | None = None, provider: str = "comfyui", min_attempt_ms: int = 0,
        now_ms: int | None = None,
    ) -> Claim | None:
        """Claim a queued job and a slot on the least loaded of ``servers`` (name -> cap); None when it is
        not claimable (running, terminal, unknown), when no server has a free slot (then it waits,
        parked), or when too little time is left before its deadline (then it has failed, settled).
        ``prices`` (name -> price per output; absent: the job's own) is recorded for the server taken."""
        claim = {"worker": worker, "lease_ms": lease_ms, "operation_id": operation_id, "prices": prices,
                 "provider": provider, "min_attempt_ms": min_attempt_ms, "now_ms": now_ms}
        if self.slots.on:  # a server's cap across shards: its own slot first (pipeline/state/slots.py)
            return self.slots.claim(job_id, operation_id, servers,
                                    lambda on: self._claim(job_id, servers=on, **claim))
        return self._claim(job_id, servers=servers, **claim)

    def _claim(
        self, job_id: str, *, worker: str, lease_ms: int, operation_id: str, servers: Mapping[str, int],
        prices: Mapping[str, int] | None, provider: str, min_attempt_ms: int, now_ms: int | None,
    ) -> Claim | None:
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "claim",
            [j.record, t.leases, t.queued, j.attempts, j.events, t.counts, t.ledger, t.dead, t.done,
             j.workflow, t.shard.wake, t.shard.fleet, t.shard.parked, t.shard.called, *t.shard.globals, j.outputs,
             t.shard.parked_any, *map(t.shard.parked_on, servers)],
            [at(now_ms), worker, lease_ms, operation_id, provider, min_attempt_ms, job_id,
             *[item for name, cap in servers.items() for item in (name, cap, (prices or {}).get(name, ""))]],
        )
        if Code(reply[0]) is not Code.OK:
            return None
        inputs = Inputs(int(reply[5]), reply[6], int(reply[7]), orjson.loads(reply[9]) if reply[9] else None,
                        frozenset(map(int, reply[10:])), int(reply[8] or 0))
        return Claim(job_id, int(reply[1]), int(reply[2]), operation_id, int(reply[3]), reply[4], inputs)

    def await_provider(self, claim: Claim, *, lease_ms: int, refused: dict[str, str] | None = None,
                       now_ms: int | None = None) -> Claim:
        """Hand a submitted attempt to its server's watcher; the watcher's claim (new generation).
        ``refused``: the server's summary of output nodes it refused while taking the prompt."""
        j = JobKeys(claim.job_id)
        reply = self._fenced("await", j, [j.record, j.tenant.leases, j.shard.fleet, j.shard.wake],
                             [claim.generation, at(now_ms), lease_ms, orjson.dumps(refused) if refused else ""])
        return replace(claim, generation=int(reply[1]))

    def collect_claim(self, job_id: str, *, worker: str, lease_ms: int, charge: tuple[str, int, str] | None = None,
                      now_ms: int | None = None) -> Collect | None:
        """Take a job the watcher holds, to collect its outputs; None if it is not watched (any more).
        ``charge``: (operation id, units, seconds: ``<attempt>:<ms>`` or '') of a prompt whose end the
        caller read at the provider, booked in the same step if that operation is still the job's
        (``Collect.charged``)."""
        j = JobKeys(job_id)
        operation, units, seconds = charge or ("", 0, "")
        reply = self.scripts("collect-claim", [j.record, j.tenant.leases, j.shard.fleet, j.shard.wake, j.tenant.ledger,
                                               *j.shard.globals], [at(now_ms), worker, lease_ms, operation, units,
                                                                   seconds],
                             durable=charge is not None)
        if Code(reply[0]) is not Code.OK:
            return None
        claim = Claim(job_id, int(reply[1]), int(reply[2]), reply[3], int(reply[5]), reply[4])
        if int(reply[10]):
            _overrun(claim, units, int(reply[10]))
        return Collect(claim, bool(reply[6]), int(reply[7]), reply[8], int(reply[9]) >= 0)

    def unpark(self, shard: keys.ShardKeys, servers: Mapping[str, int], *, call_ms: int = CALL_MS,
               batch_wait_ms: int = DEFAULT_BATCH_MAX_WAIT_SECONDS * 1000, now_ms: int | None = None) -> list[str]:
        """The shard's best parked jobs, one per free slot not promised yet, each promised it for ``call_ms``
        (with shards, reserved on its server's key: calls.py): to publish (route ``unparked``). While a batch
        job queued longer than ``batch_wait_ms`` waits, batch goes before interactive, in fair order."""
        return self.calls.unpark(shard, servers, call_ms=call_ms, batch_wait_ms=batch_wait_ms, now_ms=now_ms)[0]

    def heartbeat(self, claim: Claim, *, lease_ms: int, now_ms: int | None = None) -> int:
        j = JobKeys(claim.job_id)
        reply = self._fenced("heartbeat", j, [j.record, j.tenant.leases], [claim.generation, at(now_ms), lease_ms])
        return int(reply[1])

    def mark_submit(self, claim: Claim, *, epoch: str, lease_ms: int, min_attempt_ms: int = 0,
                    now_ms: int | None = None) -> None:
        """Record that the provider request is about to go out, renewing the lease for ``lease_ms``;
        CancelRequested if cancelled, DeadlineExceeded if too little time is left to run it,
        DispatchPaused if paused or, with shards, if the job's slot on its server lapsed (slots.py)."""
        if self.slots.on and not self.slots.confirm(claim.server, claim):  # lapsed since the claim
            raise DispatchPaused(claim.job_id)
        j = JobKeys(claim.job_id)
        reply = self.scripts("mark-submit", [j.record, j.attempts, j.tenant.leases, j.shard.fleet],
                             [claim.generation, at(now_ms), epoch, lease_ms, min_attempt_ms], durable=True)
        if Code(reply[0]) is Code.CANCELLED:
            raise CancelRequested(claim.job_id)
        if Code(reply[0]) is Code.PAUSED:
            raise DispatchPaused(claim.job_id)
        if Code(reply[0]) is Code.EXPIRED:
            raise DeadlineExceeded(claim.job_id)
        self._check(reply, j)

    def store_output(self, claim: Claim, index: int, record: dict[str, Any], *, now_ms: int | None = None) -> bool:
        j = JobKeys(claim.job_id)
        reply = self._fenced(
            "store-output", j, [j.record, j.outputs], [claim.generation, at(now_ms), index, orjson.dumps(record)],
            durable=True,
        )
        return bool(reply[1])

    def charge(self, claim: Claim, units: int, seconds_ms: int | None = None) -> int:
        """Book what the provider charged for this attempt (once per attempt), in full; whatever
        the attempt held as uncertain is resolved in the same step. More than the job held is
        logged as an error and counted (``charge_overruns_total``). ``seconds_ms``: the execution a
        per-second price booked, put on the attempt's record. Returns the units booked."""
        j = JobKeys(claim.job_id)
        seconds = "" if seconds_ms is None else f"{claim.attempt}:{seconds_ms}"
        reply = self._fenced("charge", j, [j.record, j.tenant.ledger, *j.shard.globals],
                             [claim.generation, units, seconds],
                             durable=True)
        if int(reply[2]):
            _overrun(claim, units, int(reply[2]))
        return int(reply[1])

    def finish(
        self, claim: Claim, outcome: str, *, error_class: str = "", reason: str = "",
        detail: dict[str, str] | None = None, now_ms: int | None = None,
    ) -> None:
        """End the job (completed | failed | cancelled) and settle it. Completing a job whose
        cancel was requested ends it cancelled, with its outputs."""
        j = JobKeys(claim.job_id)
        t = j.tenant
        self._freeing(
            "finish", j,
            [j.record, t.ledger, t.leases, j.attempts, j.events, j.outputs, t.counts, t.reconcile, t.dead, t.done,
             j.workflow, t.shard.wake, t.shard.fleet, *t.shard.globals, t.shard.parked, *j.parts],
            [claim.generation, at(now_ms), outcome, error_class, reason or error_class or outcome,
             orjson.dumps(detail) if detail else "", self.retention],
            durable=True, held=claim,
        )

    def retry(self, claim: Claim, *, delay_ms: int, error_class: str, free: bool = False,
              now_ms: int | None = None) -> int:
        """Park the job in retry_wait for ``delay_ms``; ``free`` gives the attempt back. Returns the due time."""
        j = JobKeys(claim.job_id)
        t = j.tenant
        reply = self._freeing(
            "retry", j,
            [j.record, t.leases, j.attempts, j.events, t.counts, t.retry, t.reconcile, t.shard.wake, t.shard.fleet,
             *t.shard.globals, t.shard.parked],
            [claim.generation, at(now_ms), delay_ms, error_class, int(free)], held=claim,
        )
        return int(reply[1])

    def begin_reconcile(self, job_id: str, *, reason: str, delay_ms: int = 0, claim: Claim | None = None,
                        now_ms: int | None = None) -> bool:
        """running -> reconciling: fenced by ``claim``, or (claim None) only if the lease expired."""
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "reconcile-begin",
            [j.record, t.ledger, t.leases, j.attempts, j.events, t.counts, t.reconcile, t.shard.wake,
             t.shard.fleet, *t.shard.globals],
            [claim.generation if claim else "", at(now_ms), delay_ms, reason],
        )
        if claim is not None:
            self._check(reply, j)
        return Code(reply[0]) is Code.OK

    def claim_reconcile(self, job_id: str, *, worker: str, lease_ms: int,
                        now_ms: int | None = None) -> Reconcile | None:
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts("reconcile-claim", [j.record, t.leases, t.reconcile, t.shard.wake],
                             [at(now_ms), worker, lease_ms])
        if Code(reply[0]) is not Code.OK:
            return None
        claim = Claim(job_id, int(reply[1]), int(reply[5]), reply[2], int(reply[6]), reply[10])
        return Reconcile(claim, bool(reply[3]), reply[4], int(reply[7]), int(reply[8]), int(reply[9]))

    def resolve_uncertain(self, claim: Claim, *, executed: bool) -> int:
        j = JobKeys(claim.job_id)
        reply = self._fenced("resolve-uncertain", j, [j.record, j.tenant.ledger, *j.shard.globals],
                             [claim.generation, int(executed)], durable=True)
        return int(reply[1])

    def reconcile_later(self, claim: Claim, *, delay_ms: int, now_ms: int | None = None) -> None:
        j = JobKeys(claim.job_id)
        self._fenced("reconcile-later", j, [j.record, j.tenant.leases, j.tenant.reconcile, j.shard.wake],
                     [claim.generation, delay_ms, at(now_ms)])

    def send_to_review(self, claim: Claim, *, expires_in_ms: int, reason: str, keep_slot: bool = False,
                       now_ms: int | None = None) -> None:
        """``keep_slot``: the prompt may still occupy its server; its slot stays taken (slots.py ``let_go``)."""
        j, t = JobKeys(claim.job_id), JobKeys(claim.job_id).tenant
        self._freeing("review", j, [j.record, t.leases, t.reconcile, t.review, j.events, t.counts, t.shard.wake,
                                    t.shard.fleet, *t.shard.globals, t.shard.parked],
                      [claim.generation, at(now_ms), expires_in_ms, reason, int(keep_slot)],
                      held=None if keep_slot else claim)

    def _fenced(self, verb: str, job: JobKeys, keys_: list[str], args: list[Any], *,
                durable: bool = False) -> list[Any]:
        return self._check(self.scripts(verb, keys_, args, durable=durable), job)

    def _freeing(self, verb: str, job: JobKeys, keys_: list[str], args: list[Any], *,
                 durable: bool = False, held: Claim | None = None) -> list[Any]:
        """A fenced step that gives the job's slot back (with shards, the ``held`` attempt's on its
        server's key too: slots.py) and answers, last, the parked jobs of its shard (``freed``); a write
        that stands without its replicas' confirmation counts too."""
        try:
            reply = self._fenced(verb, job, keys_, args, durable=durable)
        except ReplicationTimeout as lagging:
            self._freed.parked = int(lagging.reply[-1])
            self.slots.release(held)
            raise
        self._freed.parked = int(reply[-1])
        self.slots.release(held)
        return reply

