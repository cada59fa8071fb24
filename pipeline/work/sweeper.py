"""The sweeper: turns due index entries into next steps. Every step is one Lua script.

- expired leases -> reconciling (the worker stopped reporting; the provider may not have)
- due reconciliations -> a reconcile message (again only after a window without a claim)
- due outbox entries -> published; queued jobs not claimed within the window -> published
  again (their message may be lost), or failed past their deadline
- due retries -> queued, or failed past the deadline
- parked jobs (no server had a free slot) -> published again, as many as there are free slots
- expired reviews -> failed, settled as charged
- finished jobs past their retention -> purged

A pass visits only tenants whose work is due: every script that schedules work also
moves the tenant's entry in its shard's wake set (``reckon:{s<n>}:wake``) earlier, and after a
visit ``rearm`` sets it to the tenant's true next due time. An idle pass is its heartbeat plus an
unpark and a take-due per shard.
Many sweepers at once take different tenants: ``take-due`` holds each tenant it hands out
for ``RECKON_SWEEP_HOLD_SECONDS`` (30 s), so a tenant of a sweeper that died mid-pass comes due
again, for any sweeper, when its hold ends (docs/operations.md "Many sweepers"). Each sweeper's pass is in
the heartbeat hash (``at``/``by``: the latest pass of any; ``at:<host>/<pid>``: each one's).

Run it: ``python -m pipeline.work.sweeper`` (the ``sweeper`` process in the Procfile).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from typing import Callable

from pipeline import faultpoints
from pipeline.settings import Settings
from pipeline.state import fairness, history, keys, status
from pipeline.state.inputs import InputStore
from pipeline.state.keys import TenantKeys
from pipeline.state.redisconn import name_connections, open_pools
from pipeline.state.slots import KEEP_EVERY_MS
from pipeline.state.store import Store, open_store
from pipeline.work.planner import Planner

log = logging.getLogger(__name__)
#: Jobs handled per index per tenant in one visit; the tenant stays due for the rest.
BATCH = 500
#: Tenants taken per pass and shard; more wait for the next pass.
TENANTS_PER_PASS = 1000
#: Tenants taken (and held) at a time: the hold must outlast the visits of one batch, not a whole
#: pass, before another sweeper may take them too.
TAKE_BATCH = 20
#: A sweeper that starts drops the heartbeat fields of sweepers silent this long (ms), so the hash
#: names the sweepers of the last hour, not every pid since install.
FORGET_MS = 3_600_000

#: How often the sweeper looks for inputs past their retention (ms): one range read per shard.
INPUTS_EVERY_MS = 60_000

#: How far apart the fairness samples the sweeper compares are (ms).
FAIR_WINDOW_MS = 60_000


class Sweeper:
    """One pass moves every due job one step. Time is Redis's clock (``clock`` lets tests
    look into the future); every move is a fenced or state-checked script, so two
    sweepers at once never move a job twice."""

    def __init__(
        self, store: Store, publish: Callable[[str, str], None], settings: Settings, *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store, self.publish, self.settings, self.clock = store, publish, settings, clock
        self.servers = settings.caps()
        self.window_ms = int(settings.outbox_grace_seconds * 1000)
        self.retention_ms = int(settings.retention_seconds * 1000)
        #: A tenant taken by this sweeper is not taken again for this long (a sweeper that died mid-pass).
        self.hold_ms = int(settings.sweep_hold_seconds * 1000)
        self.batch_wait_ms = settings.batch_max_wait_seconds * 1000
        #: The last fairness sample and when it was taken (ms).
        self.fair_sample: tuple[int, fairness.Sample] | None = None
        #: When the sweeper last kept the servers' slots (monotonic ms).
        self.kept_ms = float("-inf")
        self.name = f"{socket.gethostname()}/{os.getpid()}"
        #: When the sweeper last looked for inputs past their retention (monotonic ms).
        self.inputs_ms = float("-inf")
        self.inputs = InputStore(store.redis, store.scripts)
        self.pruned_to: dict[str, int] = {}  # shard's inputs-by-last-use key -> where its next prune starts (ms)
        #: When the last pass began (ms, Redis's clock).
        self.pass_ms = 0
        #: Queue positions and ETAs, planned once a pass (pipeline/work/planner.py).
        self.planner = Planner(store.redis, self.servers)

    def now_ms(self) -> int:
        return self.store.server_ms() if self.clock is None else int(self.clock() * 1000)

    def sweep_once(self) -> Counter[str]:
        """One pass over the tenants with due work; returns how many jobs each step moved."""
        done: Counter[str] = Counter()
        self.pass_ms = self.now_ms()
        self.store.redis.hset(keys.SWEEPER, mapping={"at": self.pass_ms, "by": self.name,
                                                     f"at:{self.name}": self.pass_ms})
        for job_id in self.store.calls.sweep(self.servers, batch_wait_ms=self.batch_wait_ms):
            self.publish(job_id, "unparked")
            done["unparked"] += 1
        for shard in keys.shards():
            taken = 0
            while taken < TENANTS_PER_PASS:
                # Each batch is held from when it is taken, on the clock of the shard's primary (the clock
                # that stamped its leases): take-due reads it and says what it read.
                now, tenants = self.store.take_due(shard, limit=TAKE_BATCH, hold_ms=self.hold_ms,
                                                   now_ms=None if self.clock is None else self.now_ms())
                for tenant in tenants:
                    self._visit_and_rearm(tenant, now, done)
                    faultpoints.reached("sweep_visited")  # crash tests: die holding the batch's other tenants
                taken += len(tenants)
                if len(tenants) < TAKE_BATCH:
                    break
        return +done  # only the steps that moved something

    def _visit_and_rearm(self, tenant: str, now: int, done: Counter[str]) -> None:
        try:
            self._visit(TenantKeys(tenant), now, done)
        except Exception:  # one tenant's failure must not hold up the others
            log.exception("sweep of tenant %s failed; it is visited again next pass", tenant)
        finally:
            self.store.rearm(tenant, window_ms=self.window_ms, retention_ms=self.retention_ms)

    def _visit(self, t: TenantKeys, now: int, done: Counter[str]) -> None:
        due = self._due(t, now)
        for job_id in due["leases"]:
            done["leases_expired"] += self.store.begin_reconcile(job_id, now_ms=now, reason="lease_expired")
        for job_id in due["reconcile"]:
            done["reconciles_sent"] += self._redeliver(job_id, "reconciling", "reconcile", now)
        for job_id in due["outbox"]:
            done["republished"] += self._republish(job_id, now)
        for job_id in due["queued"]:
            done["redelivered"] += self._redeliver(job_id, "queued", None, now)
        for job_id in due["retry"]:
            done["retries_promoted"] += self.store.promote(job_id, now_ms=now) is not None
        for job_id in due["review"]:
            self.store.resolve_review(job_id, "failed", now_ms=now, reason="review_expired")
            done["reviews_expired"] += 1
        for job_id in due["done"]:
            done["purged"] += self.store.purge(job_id, retention_ms=self.retention_ms, now_ms=now)

    def _due(self, t: TenantKeys, now: int) -> dict[str, list[str]]:
        """Due job ids of each of the tenant's indexes, read in one round trip."""
        until = {"leases": now, "reconcile": now, "outbox": now, "queued": now - self.window_ms, "retry": now,
                 "review": now, "done": now - self.retention_ms}
        pipe = self.store.redis.pipeline(transaction=False)
        for index, score in until.items():
            pipe.zrangebyscore(getattr(t, index), "-inf", score, start=0, num=BATCH)
        return dict(zip(until, pipe.execute(), strict=True))

    def _redeliver(self, job_id: str, state: str, route: str | None, now: int) -> int:
        """Publish a job again whose message may be lost (at most once per window)."""
        priority = self.store.redeliver(job_id, state, window_ms=self.window_ms, now_ms=now)
        if priority is None:
            return 0
        self.publish(job_id, route or priority)
        return 1

    def _republish(self, job_id: str, now: int) -> int:
        """Publish an admitted job whose publication was not confirmed. The outbox entry is taken
        first, so of two sweepers on one tenant (a visit longer than the hold) one publishes; one
        that dies between the take and the publish leaves a queued job the redelivery sends."""
        record = self.store.job(job_id) or {}
        taken = self.store.confirm_published(job_id, record.get("idem_key", ""), late=True, now_ms=now)
        sent = taken and record.get("state") == "queued"
        if sent:
            self.publish(job_id, record["priority"])
        return int(sent)

    def measure_fairness(self) -> None:
        """Once a window (FAIR_WINDOW_MS): sample who waits and the cost each tenant was served, and
        publish how the window's service compares with the weighted fair shares (pipeline/state/fairness.py)."""
        if self.fair_sample is not None and self.pass_ms - self.fair_sample[0] < FAIR_WINDOW_MS:
            return
        taken = fairness.sample(self.store)
        if self.fair_sample is not None:
            fairness.publish(self.store, fairness.shares(self.fair_sample[1], taken), self.pass_ms)
        self.fair_sample = (self.pass_ms, taken)

    def keep_slots(self) -> None:
        """With shards, every KEEP_EVERY_MS: renew the server slots jobs hold, free the others
        (pipeline/state/slots.py)."""
        now = time.monotonic() * 1000  # an interval: no Redis command, and only with shards
        if self.store.slots.on and now - self.kept_ms >= KEEP_EVERY_MS:
            self.store.slots.keep(self.servers)
            self.kept_ms = now

    def expire_inputs(self) -> int:
        """Every INPUTS_EVERY_MS: remove the inputs no job has named for ``RECKON_INPUT_RETENTION_SECONDS``
        and no unfinished job uses, and prune the large sets of jobs of the inputs named since the last pass
        (pipeline/state/inputs.py); how many inputs went. Two commands per shard when nothing is due and no
        input was named since, and a set's size for each input named since (one round trip per 500)."""
        now = time.monotonic() * 1000
        if now - self.inputs_ms < INPUTS_EVERY_MS:
            return 0
        self.inputs_ms = now
        retention_ms = self.settings.input_retention_seconds * 1000
        removed = 0
        for shard in keys.shards():
            now_ms = self.now_ms()
            removed += len(self.inputs.expire(shard, retention_ms=retention_ms, now_ms=now_ms))
            # a sweeper's first pass starts at the two passes before it
            since = self.pruned_to.get(shard.inputs_used, now_ms - 2 * INPUTS_EVERY_MS)
            self.pruned_to[shard.inputs_used] = self.inputs.prune(shard, since_ms=since)[1]
        return removed

    def forget_stopped(self) -> list[str]:
        """Drop the heartbeat fields of sweepers silent for ``FORGET_MS``; their names."""
        now = self.now_ms()
        beat = self.store.redis.hgetall(keys.SWEEPER)
        stale = [name for name, at in beat.items() if name.startswith("at:") and now - int(at) > FORGET_MS]
        if stale:
            self.store.redis.hdel(keys.SWEEPER, *stale)
        return [name.removeprefix("at:") for name in stale]

    def run(self, stop: threading.Event) -> None:
        try:
            for name in self.forget_stopped():
                log.info("sweeper %s has not passed for an hour: dropped from the heartbeat", name)
        except Exception:  # only housekeeping: the next sweeper to start does it
            log.warning("could not drop the heartbeats of stopped sweepers", exc_info=True)
        while not stop.is_set():
            try:  # first, and on its own: slots nobody holds (a crash) are freed even if a pass fails
                self.keep_slots()
            except Exception:
                log.exception("keeping the servers' slots failed")
            try:
                moved = self.sweep_once()
                history.record(self.store.redis, self.pass_ms, lambda: status.snapshot(self.store, self.servers))
                self.measure_fairness()
                if expired := self.expire_inputs():
                    moved["inputs_expired"] = expired
                if moved:
                    log.info("sweep: %s", dict(moved))
            except Exception:  # keep sweeping: one bad pass must not stop recovery
                log.exception("sweep failed")
            try:  # on its own: a plan that fails leaves the recovery above alone
                self.planner.plan(self.pass_ms)
            except Exception:
                log.exception("planning failed")
            stop.wait(self.settings.sweep_interval_seconds)


def main() -> None:
    from pipeline.logs import configure
    from pipeline.work.broker import Publisher, build_broker

    configure("sweeper")
    name_connections("sweeper")
    settings = Settings.from_env()
    sweeper = Sweeper(open_store(settings), Publisher(build_broker(settings)), settings)
    open_pools(1)  # one thread sweeps: its connections open now, not with the first job it sweeps
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sweeping every %.1fs", settings.sweep_interval_seconds)
    sweeper.run(stop)


if __name__ == "__main__":
    main()
