"""The sweeper: turns due index entries into next steps. Every step is one Lua script.

- expired leases -> reconciling (the worker stopped reporting; the provider may not have)
- due reconciliations -> a reconcile message (once per interval)
- due retries -> queued (unless the provider awaits credential repair), or failed past the deadline
- expired reviews -> failed, settled as charged
- due outbox entries -> published

Run it: ``python -m pipeline.sweeper`` (the ``sweeper`` process in the Procfile).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from typing import Callable

from .keys import TenantKeys
from .settings import Settings
from .store import Store

log = logging.getLogger(__name__)
#: Jobs handled per index per tenant in one pass; the next pass takes the rest.
BATCH = 500


class Sweeper:
    def __init__(
        self, store: Store, publish: Callable[[str, str], None], settings: Settings, *, provider: str = "comfyui",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.publish, self.settings, self.provider, self.clock = store, publish, settings, provider, clock

    def sweep_once(self) -> Counter[str]:
        """One pass over every tenant; returns how many jobs each step moved."""
        done: Counter[str] = Counter()
        now = int(self.clock() * 1000)
        blocked = self.store.provider_block(self.provider) is not None
        for tenant in self.store.tenants():
            t = TenantKeys(tenant)
            for job_id in self.store.index(t.leases, until_ms=now, limit=BATCH):
                done["leases_expired"] += self.store.begin_reconcile(
                    job_id, now_ms=now, due_ms=now, reason="lease_expired")
            for job_id in self.store.index(t.reconcile, until_ms=now, limit=BATCH):
                self.store.redis.zadd(t.reconcile, {job_id: now + int(self.settings.reconcile_interval_seconds * 1000)},
                                      xx=True)
                self.publish(job_id, "reconcile")
                done["reconciles_sent"] += 1
            if not blocked:
                for job_id in self.store.index(t.retry, until_ms=now, limit=BATCH):
                    done["retries_promoted"] += self.store.promote(job_id, now_ms=now) is not None
            for job_id in self.store.index(t.review, until_ms=now, limit=BATCH):
                self.store.resolve_review(job_id, "failed", now_ms=now, reason="review_expired")
                done["reviews_expired"] += 1
            for job_id in self.store.index(t.outbox, until_ms=now, limit=BATCH):
                done["republished"] += self._republish(job_id)
        return done

    def _republish(self, job_id: str) -> int:
        record = self.store.job(job_id) or {}
        sent = record.get("state") == "queued"
        if sent:
            self.publish(job_id, record["priority"])
        self.store.confirm_published(job_id, record.get("idem_key", ""))
        return int(sent)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                moved = self.sweep_once()
                if moved:
                    log.info("sweep: %s", dict(moved))
            except Exception:  # keep sweeping: one bad pass must not stop recovery
                log.exception("sweep failed")
            stop.wait(self.settings.sweep_interval_seconds)


def main() -> None:
    from .broker import Publisher, build_broker
    from .store import connect

    logging.basicConfig(level=logging.INFO, format="%(asctime)s sweeper %(levelname)s %(message)s")
    settings = Settings.from_env()
    sweeper = Sweeper(Store(connect(settings.redis_url)), Publisher(build_broker(settings)), settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sweeping every %.1fs", settings.sweep_interval_seconds)
    sweeper.run(stop)


if __name__ == "__main__":
    main()
