"""Every Redis key reckon uses is built here.

The state is split into shards (``RECKON_SHARDS``, 1 by default). A tenant lives in shard
``crc32(tenant) % shards``, and every key of a shard (its figures, queues, fleet slots, and all
its tenants' and jobs' keys) carries the shard's hash tag ``{s<n>}``: one Redis Cluster slot,
so each Lua script is atomic on one primary. Job ids embed the tenant (``<tenant>.<hex>``), so
a worker that only has a job id finds every key.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from pipeline.state.hookkeys import WebhookKeys
from pipeline.state.idemkeys import IdempotencyKeys
from pipeline.state.ids import tenant_of

PREFIX = "reckon"
#: Hash: the sweeper's heartbeat: ``at`` (ms, Redis's clock, written every pass) and ``by`` (host/pid).
SWEEPER = f"{PREFIX}:sweeper"
#: Hash: status page samples (pipeline/state/history.py): slot % 120 -> JSON {at, depth and oldest age per class}.
HISTORY = f"{PREFIX}:history"
#: Hash: fair-share figures the sweeper publishes (pipeline/state/fairness.py): at, min:<class>, max:<class>.
FAIRNESS = f"{PREFIX}:fairness"
#: Hash: server -> its latest prompts' run times (ms, comma-separated), as its watcher heard them (runclock.py).
RUN_TIMES = f"{PREFIX}:fleet:runtimes"
#: Rank of a batch job in a shard's queue, due and parked sets (interactive ranks are plain times in ms).
BATCH_RANK = 10**13
#: Why dispatch to a server may be stopped (fields ``<reason>:<server>`` of a shard's ``fleet``): an operator's
#: pause, credentials refused, or no answer (connection refused, 5xx) while the watcher probes it.
SERVER_BLOCKS = ("dispatch_paused", "provider_credentials", "provider_unreachable")

_shards = 1


def use_shards(count: int) -> None:
    """Set how many shards the state is split into (``RECKON_SHARDS``; every process of a deployment
    must say the same: ``Store`` checks it against the count recorded in Redis)."""
    global _shards
    if count < 1:
        raise ValueError("RECKON_SHARDS: at least one shard")
    _shards = count


def shard_of(tenant: str) -> int:
    return zlib.crc32(tenant.encode()) % _shards


@dataclass(frozen=True)
class ShardKeys(WebhookKeys):
    """The keys one shard's scripts keep in step with its tenants' keys. Every key of a shard,
    its tenants' and jobs' included, carries the hash tag ``{s<n>}``: one cluster slot, so each
    script is atomic on one primary (docs/failover.md "Redis Cluster")."""

    n: int

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{{s{self.n}}}:{suffix}"

    @property
    def stats(self) -> str:
        """Hash: the shard's figures, kept in step by the scripts (job counts per class and state, ledger
        totals, counters, histograms, service-time estimates; docs/redis.md "Keys" lists the fields)."""
        return self._k("stats")

    @property
    def queue(self) -> str:
        """Sorted set: every queued job id -> class rank (0 interactive, BATCH_RANK batch) + when queued (ms)."""
        return self._k("queue")

    @property
    def due(self) -> str:
        """Sorted set: every unfinished job id -> class rank + its deadline (ms); overdue jobs score below now."""
        return self._k("due")

    @property
    def globals(self) -> tuple[str, str, str]:
        """The three keys every script that moves a job or money keeps in step (``use_globals`` in lua/_lib.lua)."""
        return self.stats, self.queue, self.due

    @property
    def admission(self) -> str:
        """Hash: admission settings an operator changes at run time (``reckon admission set`` writes every
        shard): ``queue_cap:<class>``, ``target_s:interactive``; a field not set takes its default."""
        return self._k("admission")

    @property
    def tenants(self) -> str:
        """Set: the names of the shard's tenants."""
        return self._k("tenants")

    @property
    def wake(self) -> str:
        """Sorted set: tenant -> when its next work is due (ms). The sweeper visits only due tenants."""
        return self._k("wake")

    @property
    def fleet(self) -> str:
        """Hash: the provider fleet as this shard uses it. ``busy:<server>`` prompts in flight (slots taken
        by this shard's claims; with shards, a server's cap across them is held by ``server_slots``); ``<reason>:<server>`` (``SERVER_BLOCKS``) -> since when
        (ms) while dispatch to the server is stopped, and ``pause_class:<class>`` while a workload class is
        paused (both written to every shard); ``w:<job id>`` -> JSON {server, gen, op, attempt, deadline,
        and ``cancel`` once the client cancelled} for each prompt waiting at a server, followed by the server's watcher; ``rr``;
        ``vt:<class>`` (virtual time) and ``served:<class>:<tenant>`` (cost dispatched: pipeline/state/fairness.py)."""
        return self._k("fleet")

    @property
    def parked(self) -> str:
        """Sorted set: queued job id waiting for a free server slot, scored BATCH_RANK for batch + its
        finish tag (lua/_slots.lua); below 0 (its tag less BATCH_RANK) for a batch job moved up by the starvation bound."""
        return self._k("fleet:parked")

    @property
    def parked_any(self) -> str:
        """Sorted set: each parked job any server can run, scored as in ``parked`` when it parked: the index a
        free slot's best job is found in, with ``parked_on`` (lua/_waiting.lua; entries of jobs that left the
        parked set are dropped when an unpark meets them)."""
        return self._k("fleet:parked-any")

    def parked_on(self, server: str) -> str:
        """Sorted set: each parked job only some servers can run, ``server`` among them (its record's
        ``servers``), scored as in ``parked`` when it parked (lua/_waiting.lua)."""
        return self._k(f"fleet:parked-on:{server}")

    @property
    def called(self) -> str:
        """Sorted set: parked job id called to a free slot (published, not yet claimed) -> when the promise lapses."""
        return self._k("fleet:called")

    @property
    def changes(self) -> str:
        """Stream: one entry per job event (``job``, ``tenant``, ``event``: its JSON), added by the script that
        appends the event (``push_events`` in lua/_lib.lua), about the newest 100,000 kept: what wakes the
        event streams (api/streams/)."""
        return self._k("changes")

    @property
    def inputs_used(self) -> str:
        """Sorted set: ``<tenant>/<sha256>`` of each uploaded input -> when a job last named it, or it was last
        uploaded (ms): what the retention pass reads (pipeline/state/inputs.py)."""
        return self._k("inputs:used")

    @property
    def plan(self) -> str:
        """Hash: each parked or watched job -> its packed queue position and ETA range, rewritten by the planner's
        pass and expiring soon after (pipeline/state/plans.py); ``d:<server>`` -> its measured run time (ms)."""
        return self._k("plan")

    @property
    def meta(self) -> str:
        """Hash (shard 0 only): ``shards`` -> the shard count this deployment was created with."""
        return self._k("meta")


def shard_count() -> int:
    return _shards


def shards() -> list[ShardKeys]:
    return [ShardKeys(n) for n in range(_shards)]


def watcher_lock(server: str) -> str:
    """String: the lock (redis-py ``Lock``) of the one watcher following ``server``."""
    return f"{PREFIX}:fleet:watcher:{server}"


def api_key(key_hash: str) -> str:
    """String key: sha256 of an API key -> tenant name."""
    return f"{PREFIX}:apikey:{key_hash}"



@dataclass(frozen=True)
class TenantKeys(IdempotencyKeys):
    name: str

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{{s{shard_of(self.name)}}}:t:{self.name}:{suffix}"

    @property
    def shard(self) -> ShardKeys:
        return ShardKeys(shard_of(self.name))

    @property
    def ledger(self) -> str:
        """Hash: allowance, reserved, settled, uncertain, job_seq."""
        return self._k("ledger")

    @property
    def counts(self) -> str:
        """Hash: state -> number of this tenant's jobs in it."""
        return self._k("counts")

    @property
    def jobs(self) -> str:
        """Sorted set: job id scored by admission sequence (newest = highest)."""
        return self._k("jobs")

    @property
    def queued(self) -> str:
        """Sorted set: queued job id scored by when its message was last sent (ms; later as redeliveries repeat)."""
        return self._k("queued")

    @property
    def leases(self) -> str:
        """Sorted set: running job id scored by lease expiry (ms)."""
        return self._k("leases")

    @property
    def outbox(self) -> str:
        """Sorted set: job id not yet known to be in the broker, scored by republish time (ms)."""
        return self._k("outbox")

    @property
    def retry(self) -> str:
        """Sorted set: retry_wait job id scored by when it may run again (ms)."""
        return self._k("retry")

    @property
    def reconcile(self) -> str:
        """Sorted set: reconciling job id scored by when to ask the provider next (ms)."""
        return self._k("reconcile")

    @property
    def review(self) -> str:
        """Sorted set: needs_review job id scored by when the review expires (ms)."""
        return self._k("review")

    @property
    def dead(self) -> str:
        """Sorted set: dead-lettered (failed) job id scored by when it failed (ms)."""
        return self._k("dead")

    @property
    def done(self) -> str:
        """Sorted set: finished (terminal) job id scored by when it finished (ms); purged after retention."""
        return self._k("done")

    @property
    def bookings(self) -> str:
        """Hash: booking id -> JSON {job, attempt, units, reason, at} of each adjustment booked for the tenant
        (lua/adjust.lua); kept as long as the job it was booked against (lua/purge.lua), so an id is booked once
        while a statement can be reconciled against it (docs/costs.md)."""
        return self._k("bookings")

    @property
    def booking_log(self) -> str:
        """Sorted set: booking id of each adjustment -> when it was booked (ms): the usage records' adjustments."""
        return self._k("booking_log")

    @property
    def limits(self) -> str:
        """Hash: max_inflight, rate (jobs/s), burst, tokens, at (ms), weight: the admission limits and fair-share
        weight (``reckon tenant set``); hooks: the webhook event types the tenant's endpoints ask for
        (``,job.completed,job.failed,``), copied into each job it admits."""
        return self._k("limits")

    @property
    def webhooks(self) -> str:
        """Hash: endpoint id -> JSON endpoint (url, types, created_at, secrets with the end of each rotated one's
        overlap): the tenant's webhook endpoints (pipeline/webhooks/endpoints.py)."""
        return self._k("webhooks")

    @property
    def inputs(self) -> str:
        """Hash: sha256 -> JSON input (name, sha256, bytes, content_type, created_at), and ``total``: the bytes of
        all of them, held against the quota (pipeline/state/inputs.py)."""
        return self._k("inputs")

    def input_jobs(self, sha256: str) -> str:
        """Set: id of each job admitted naming the input since it was last pruned of finished jobs (by a delete,
        or the retention pass when it is large): an unfinished job among them keeps the input."""
        return self._k(f"input:{sha256}:jobs")


@dataclass(frozen=True)
class JobKeys:
    job_id: str

    @property
    def tenant(self) -> TenantKeys:
        return TenantKeys(tenant_of(self.job_id))

    @property
    def shard(self) -> ShardKeys:
        return ShardKeys(shard_of(tenant_of(self.job_id)))

    def _k(self, suffix: str) -> str:
        return f"{PREFIX}:{{s{shard_of(tenant_of(self.job_id))}}}:job:{self.job_id}{suffix}"

    @property
    def record(self) -> str:
        """Hash: the job record (``HGETALL`` shows it)."""
        return self._k("")

    @property
    def attempts(self) -> str:
        """Hash: attempt number -> JSON attempt record; fields are only added."""
        return self._k(":attempts")

    @property
    def events(self) -> str:
        """List: JSON state-change events, appended only."""
        return self._k(":events")

    @property
    def progress(self) -> str:
        """List: JSON progress events of the current run, the last N kept (``pipeline.state.progress``)."""
        return self._k(":progress")

    @property
    def progress_seen(self) -> str:
        """Hash of earlier versions: a job's progress marks, now record fields ``pm:<attempt>:<node>``
        (lua/progress.lua); a job that had it loses it when it is packed, with its other parts."""
        return self._k(":progress_seen")

    @property
    def outputs(self) -> str:
        """Hash: output index -> JSON {sha256, bytes, content_type}."""
        return self._k(":outputs")

    @property
    def workflow(self) -> str:
        """String: the job's workflow (JSON); dropped when the job ends, except for dead letters."""
        return self._k(":workflow")

    @property
    def parts(self) -> list[str]:
        """The keys a job that ends completed or cancelled is packed from, in the order the scripts
        take them (``parts_at`` in lua/_lib.lua): attempts, events, outputs, progress, progress_seen."""
        return [self.attempts, self.events, self.outputs, self.progress, self.progress_seen]


@dataclass(frozen=True)
class ProviderKeys:
    name: str

    @property
    def budget(self) -> str:
        """Hash: tokens left in the provider's shared retry budget."""
        return f"{PREFIX}:{{p:{self.name}}}:budget"


def server_offers(server: str) -> str:
    """String: JSON {at (ms), offer: {nodes, models: {folder: files}} or null (the server does not say)}:
    what the server can run, as its watcher last read it (pipeline/state/offers.py)."""
    return f"{PREFIX}:{{server:{server}}}:offers"


def server_slots(server: str) -> str:
    """Sorted set: ``<job id>/<operation id>`` (an attempt) -> when it took one of the server's dispatch slots
    or last renewed it (ms, this key's clock; it never lapses), and ``<job id>/call`` (a call's reservation)
    -> when that lapses; taken before a claim when the state is split into shards (slots.py, calls.py)."""
    return f"{PREFIX}:{{server:{server}}}:slots"


def server_waiting(server: str) -> str:
    """Sorted set: shard number -> its turn (the count of calls to the server's slots when it was last served
    one; 0 from when it began to wait): the shards with jobs parked for the server, beside ``server_slots``
    with shards, so a freed slot calls the shard served longest ago first (pipeline/state/calls.py)."""
    return f"{PREFIX}:{{server:{server}}}:waiting"


def tenant_disabled(tenant: str) -> str:
    """String: exists while the tenant is disabled (value: since when, ms); its keys are refused."""
    return TenantKeys(tenant)._k("disabled")


def tenant_api_keys(tenant: str) -> str:
    """Set: the sha256 of each API key created for the tenant (``reckon key list``)."""
    return TenantKeys(tenant)._k("apikeys")


def workflow(name: str) -> str:
    """Hash: a saved workflow's versions (pipeline/state/workflows.py); in shard 0's slot, with ``WORKFLOWS``."""
    return f"{PREFIX}:{{s0}}:workflow:{name}"


WORKFLOWS = f"{PREFIX}:{{s0}}:workflows"  #: Set: the names of saved workflows (every owner's).
