"""The ``webhooks`` process: fans out webhook events and sends each delivery, at least once.

One thread per shard waits for outbox events (BLMOVE), fans them out (pipeline/webhooks/deliveries.py)
and takes due deliveries, which a pool of ``RECKON_WEBHOOK_THREADS`` threads sends. An endpoint gets at
most ``RECKON_WEBHOOK_ENDPOINT_CONCURRENCY`` requests at once from this process, and a tenant's endpoints
together at most ``RECKON_WEBHOOK_TENANT_CONCURRENCY`` (its share: however slow or hung its endpoints, they
hold no more threads than that, and the other tenants' deliveries go on); after ``CIRCUIT_FAILURES``
failures in a row its circuit opens: nothing is sent to it for ``CIRCUIT_SECONDS``, doubling each time it
opens again (up to ``CIRCUIT_MAX_SECONDS``, and never longer than ``RECKON_WEBHOOK_RETRY_MAX_SECONDS``), then
one try at a time until one succeeds. A failed try is due again after an exponential backoff with
jitter, or the endpoint's ``Retry-After`` if that is later (at most the longest delay), until the retry
window ends (docs/webhooks.md "Delivery").
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import random
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import redis

from pipeline import faultpoints
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.keys import ShardKeys
from pipeline.state.redisconn import name_connections
from pipeline.state.store import Store, open_store
from pipeline.webhooks import guard, signing
from pipeline.webhooks.deliveries import Deliveries, Taken, Took
from pipeline.webhooks.endpoints import EndpointNotFound, Endpoints, signing_secrets

log = logging.getLogger(__name__)

CIRCUIT_FAILURES = 5
CIRCUIT_SECONDS = 30.0
CIRCUIT_MAX_SECONDS = 600.0
#: Longest wait for an outbox event when nothing is due sooner (a blocking BLMOVE: an event wakes it at once).
IDLE_WAIT_SECONDS = 1.0
#: Longest time between takes: what is due is known from each take, but a redelivery (``reckon webhook
#: redeliver``) or a lapsed lease makes deliveries due without telling this process.
IDLE_TAKE_SECONDS = 5.0


def backoff(attempts: int, first: float, most: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds before try ``attempts + 1``: ``first`` doubled per try so far, at most ``most``, of which a
    random half (equal jitter: tries of many deliveries that failed together spread out)."""
    base = min(most, first * 2 ** min(max(0, attempts - 1), 62))
    return base / 2 + rand() * base / 2


def retry_after(value: str | None, now: float, most: float) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date), at most ``most`` (a
    receiver's 400-digit number is no reason to wait for ever, nor a float that overflows), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(most, float(value))
    try:
        return min(most, max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now))
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class Circuit:
    """One endpoint's failures in a row, and until when nothing is sent to it (monotonic seconds): open for
    ``CIRCUIT_SECONDS``, doubled each time the one try after a pause fails too, at most ``longest`` (and
    ``CIRCUIT_MAX_SECONDS``). Tries that were in flight when it opened and fail then do not open it again."""

    def __init__(self, longest: float = CIRCUIT_MAX_SECONDS) -> None:
        self.longest = min(longest, CIRCUIT_MAX_SECONDS)
        self.failures, self.opened, self.open_until = 0, 0, 0.0

    def places(self, now: float, default: int) -> int:
        if now < self.open_until:
            return 0
        return 1 if self.failures >= CIRCUIT_FAILURES else default

    def record(self, ok: bool, now: float) -> bool:
        """Count a try's outcome; whether the circuit opened."""
        if ok:
            self.failures, self.opened, self.open_until = 0, 0, 0.0
            return False
        self.failures += 1
        if self.failures < CIRCUIT_FAILURES or now < self.open_until:
            return False
        self.opened += 1
        self.open_until = now + min(self.longest, CIRCUIT_SECONDS * 2 ** (self.opened - 1))
        return True


class Sender:
    def __init__(self, store: Store, settings: Settings, *, post: Callable[..., guard.Answer] = guard.post) -> None:
        self.settings, self.post = settings, post
        self.endpoints, self.deliveries = Endpoints(store), Deliveries(store)
        self.pool = ThreadPoolExecutor(settings.webhook_threads, thread_name_prefix="webhook")
        self.lock = threading.Lock()
        #: tries in flight per endpoint and per tenant, and each endpoint's tenant once a take showed it
        self.inflight: Counter[str] = Counter()
        self.tenant_inflight: Counter[str] = Counter()
        self.tenant_of: dict[str, str] = {}
        self.circuits: dict[str, Circuit] = {}
        #: shard -> when its next take is due (monotonic seconds), and the lock one take at a time holds
        self.next_take = {shard.n: 0.0 for shard in keys.shards()}
        self.taking = {shard.n: threading.Lock() for shard in keys.shards()}
        #: endpoints that may have more due than the last take gave them: a try's end there takes again
        self.backlogged: set[str] = set()
        #: tenants whose due deliveries waited for a free place of theirs: a try's end there takes again
        self.full: set[str] = set()
        self.window_ms = int(settings.webhook_retry_window_seconds * 1000)
        #: A try's lease: every hop's timeout, and room for its outcome to be written.
        self.lease_ms = int((settings.webhook_timeout_seconds * (settings.webhook_max_redirects + 1) + 5) * 1000)

    def run(self, stop: threading.Event) -> None:
        threads = [threading.Thread(target=self.run_shard, args=(shard, stop), name=f"webhooks-s{shard.n}")
                   for shard in keys.shards()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.pool.shutdown(wait=True)

    def run_shard(self, shard: ShardKeys, stop: threading.Event) -> None:
        waiting = True  # events may wait in the taking list (a process before this one died mid-pass)
        while not stop.is_set():
            try:
                fanned = self.deliveries.fan_out(shard, self.endpoints.all) if waiting else 0
                if fanned or time.monotonic() >= self.next_take[shard.n]:
                    self.take(shard)
                if fanned:
                    continue
                wait = min(IDLE_WAIT_SECONDS, max(0.01, self.next_take[shard.n] - time.monotonic()))
                waiting = self.deliveries.move_one(shard, wait)
            except Exception:  # Redis down, a defect: logged, the loop goes on
                log.exception("webhooks: pass failed")
                waiting = True
                stop.wait(1.0)

    def take(self, shard: ShardKeys) -> None:
        """Take what is due at the ready endpoints within their free places, their tenants' and the idle
        threads, and hand it to the pool; set when to take next. Run by the shard's thread, and by a pool
        thread after a try whose endpoint or tenant had more due or whose job's next delivery became due;
        one take at a time per shard (a tenant's endpoints are all on its shard), so two never hand out the
        same places."""
        with self.taking[shard.n]:
            now, share = time.monotonic(), self.settings.webhook_tenant_concurrency
            with self.lock:
                room = self.settings.webhook_threads - sum(self.inflight.values())
                tenants = {tenant: max(0, share - n) for tenant, n in self.tenant_inflight.items()}
            if room <= 0:
                self.next_take[shard.n] = now + IDLE_TAKE_SECONDS  # the next try to end takes again
                return
            offered: dict[str, int] = {}
            took = self.deliveries.take(shard, lambda endpoint: self.places(endpoint, now, offered), most=room,
                                        lease_ms=self.lease_ms, window_ms=self.window_ms, tenants=tenants,
                                        share=share)
            self.count_taken(took, offered)
            redis_now, earliest = self.deliveries.clock(), took.earliest
            wait = IDLE_TAKE_SECONDS if earliest is None or earliest <= redis_now else (earliest - redis_now) / 1000
            self.next_take[shard.n] = now + (0.0 if len(took.taken) == room else min(wait, IDLE_TAKE_SECONDS))
            for item in took.taken:
                try:
                    self.pool.submit(self.send, shard, item, int(redis_now))
                except RuntimeError:  # shutting down: its lease ends and it is tried again
                    with self.lock:
                        self.inflight[item.endpoint] -= 1
                        self.tenant_inflight[item.tenant] -= 1

    def places(self, endpoint: str, now: float, offered: dict[str, int]) -> tuple[int, int] | None:
        """What a take offers an endpoint: (free places, until when (Redis ms) its circuit keeps it closed),
        or None to leave it out (no free place of its own, or of its tenant's when this process knows it)."""
        with self.lock:
            circuit = self.circuits.get(endpoint)
            default = self.settings.webhook_endpoint_concurrency
            free = (circuit.places(now, default) if circuit else default) - self.inflight[endpoint]
            if circuit is not None and now < circuit.open_until:  # not before it may be tried again
                return 0, int(self.deliveries.clock() + (circuit.open_until - now) * 1000)
            tenant = self.tenant_of.get(endpoint)
            if tenant is not None and self.tenant_inflight[tenant] >= self.settings.webhook_tenant_concurrency:
                self.full.add(tenant)
                return None
            if free <= 0:
                self.backlogged.add(endpoint)
                return None
        offered[endpoint] = free
        return free, 0

    def count_taken(self, took: Took, offered: dict[str, int]) -> None:
        """Count the places a take handed out, and note the endpoints and tenants that may have more due
        than it gave them (a try's end there takes again)."""
        with self.lock:
            got = Counter(item.endpoint for item in took.taken)
            for endpoint, free in offered.items():
                if got[endpoint] >= free:
                    self.backlogged.add(endpoint)
                else:
                    self.backlogged.discard(endpoint)
            for item in took.taken:
                self.inflight[item.endpoint] += 1
                self.tenant_inflight[item.tenant] += 1
                self.tenant_of[item.endpoint] = item.tenant
            self.full.update(took.full)

    def send(self, shard: ShardKeys, item: Taken, redis_now: int) -> None:
        outcome, error, status, asked = "retry", "", None, None
        try:
            endpoint = self.endpoint(item)
            if endpoint is None:
                outcome = "dropped"
            else:
                headers = {"content-type": "application/json", "user-agent": "reckon-webhooks/1",
                           **signing.headers(signing_secrets(endpoint, redis_now), item.message, int(time.time()),
                                             item.body)}
                s = self.settings
                answer = self.post(endpoint["url"], item.body, headers, allow_private=s.webhook_allow_private,
                                   timeout=s.webhook_timeout_seconds, max_redirects=s.webhook_max_redirects)
                faultpoints.reached("webhook_sent")
                status = answer.status
                if 200 <= answer.status < 300:
                    outcome = "delivered"
                else:
                    error = f"HTTP {answer.status}"
                    asked = retry_after(answer.retry_after, time.time(), s.webhook_retry_max_seconds)
        except guard.Refused as exc:
            error = f"refused: {exc}"
        except (OSError, http.client.HTTPException) as exc:
            error = _failure(exc)
        except Exception as exc:  # a defect: the try is retried like a failure, and logged
            log.exception("webhooks: try failed")
            error = type(exc).__name__
        s = self.settings
        delay = max(backoff(item.attempts, s.webhook_retry_first_seconds, s.webhook_retry_max_seconds), asked or 0.0)
        self.finish(shard, item, outcome, delay, error, status)

    def endpoint(self, item: Taken) -> dict[str, Any] | None:
        """The delivery's endpoint as Redis holds it now (its URL and secrets), or None: removed since the
        delivery was made, it gets nothing (a cache here sent to an endpoint removed a moment before)."""
        try:
            return self.endpoints.get(item.tenant, item.endpoint)
        except EndpointNotFound:
            return None

    def finish(self, shard: ShardKeys, item: Taken, outcome: str, delay: float, error: str, status: int | None) -> None:
        """Record the try's outcome, free its place, and take again at once when that may hand out more: the
        job's next delivery became due, the endpoint has more due, or every thread was busy."""
        more = False
        try:
            recorded, more = self.record(shard, item, outcome, delay, error, status)
            if recorded in ("retry", "exhausted"):
                log.info("webhook try failed", extra={"endpoint": item.endpoint, "webhook_id": item.message,
                                                      "count": item.attempts, "reason": error, "outcome": recorded})
        except Exception:  # Redis down: the lease ends and the delivery is tried again
            log.exception("webhooks: outcome not recorded")
        with self.lock:
            busy = sum(self.inflight.values()) >= self.settings.webhook_threads
            self.inflight[item.endpoint] -= 1
            self.tenant_inflight[item.tenant] -= 1
            if self.tenant_inflight[item.tenant] <= 0:
                del self.tenant_inflight[item.tenant]
            circuit = self.circuits.setdefault(item.endpoint, Circuit(self.settings.webhook_retry_max_seconds))
            opened = outcome != "dropped" and circuit.record(outcome == "delivered", time.monotonic())
            if not circuit.failures:
                del self.circuits[item.endpoint]  # a healthy endpoint needs no entry
            again = more or busy or item.endpoint in self.backlogged or item.tenant in self.full
            self.full.discard(item.tenant)
        if opened:
            log.warning("webhook endpoint circuit open", extra={"endpoint": item.endpoint})
        if again:
            try:
                self.take(shard)
            except Exception:
                log.exception("webhooks: take failed")


    def record(self, shard: ShardKeys, item: Taken, outcome: str, delay: float, error: str,
               status: int | None) -> tuple[str | None, bool]:
        """Write the try's outcome under its lease; an outcome that cannot be written (a defect in making
        it, not Redis out of reach) is written as a failed try after the backoff, so it counts against the
        retry window and ends exhausted: never a delivery sent again each lease for ever."""
        try:
            return self.deliveries.settle(shard, item, outcome, delay_ms=int(delay * 1000), error=error,
                                          status=status, window_ms=self.window_ms)
        except redis.RedisError:
            raise
        except Exception as exc:
            log.exception("webhooks: outcome not written; recorded as a failed try")
            s = self.settings
            delay = backoff(item.attempts, s.webhook_retry_first_seconds, s.webhook_retry_max_seconds)
            return self.deliveries.settle(shard, item, "retry", delay_ms=int(delay * 1000), status=status,
                                          error=f"outcome not recorded: {type(exc).__name__}",
                                          window_ms=self.window_ms)


def _failure(exc: BaseException) -> str:
    """A failure as logged and recorded: its kind, never the URL."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return "connection dropped"
    return type(exc).__name__


def main() -> None:
    from pipeline.logs import configure

    configure("webhooks")
    name_connections("webhooks")
    settings = Settings.from_env()
    sender = Sender(open_store(settings), settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sending webhooks with %d threads", settings.webhook_threads)
    sender.run(stop)


if __name__ == "__main__":
    main()
