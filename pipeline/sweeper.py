"""The sweeper: expires dead leases and publishes what the outbox says never reached the broker.

Run it: ``python -m pipeline.sweeper`` (the ``sweeper`` process in the Procfile).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from .keys import TenantKeys
from .settings import Settings
from .store import Store

log = logging.getLogger(__name__)
#: Jobs handled per index per tenant in one pass; the next pass takes the rest.
BATCH = 500


class Sweeper:
    def __init__(
        self, store: Store, publish: Callable[[str, str], None], settings: Settings, *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.publish, self.settings, self.clock = store, publish, settings, clock

    def sweep_once(self) -> dict[str, int]:
        """One pass over every tenant; returns how many jobs each step touched."""
        done = {"leases_expired": 0, "republished": 0}
        now_ms = int(self.clock() * 1000)
        for tenant in self.store.tenants():
            t = TenantKeys(tenant)
            for job_id in self.store.redis.zrangebyscore(t.leases, "-inf", now_ms, start=0, num=BATCH):
                if self.store.expire_lease(job_id, now_ms=now_ms):
                    done["leases_expired"] += 1
            for job_id in self.store.redis.zrangebyscore(t.outbox, "-inf", now_ms, start=0, num=BATCH):
                done["republished"] += self._republish(job_id)
        return done

    def _republish(self, job_id: str) -> int:
        record = self.store.job(job_id) or {}
        sent = record.get("state") == "queued"
        if sent:
            self.publish(job_id, record["priority"])
            log.info("job %s: published from the outbox", job_id)
        self.store.confirm_published(job_id, record.get("idem_key", ""))
        return int(sent)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sweep_once()
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
