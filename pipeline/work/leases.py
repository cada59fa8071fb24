"""One thread per worker process keeps the leases of every attempt the process runs, and sends the
retry-budget refunds of its successes in batches.

A lease is renewed every third of its length (``Store.heartbeat``, on Redis's clock) until its
attempt ends or it is fenced out. One thread for all of a process's claims, not one per claim: a
thread per job cost a start and a join on every job, for a renewal that a job shorter than a third
of the lease never needs. Each renewal that falls due runs in a thread of its own, so one that
hangs (its Cluster primary stopped) does not hold up the others.

A success refunds ``retry_refund_tokens`` to the shared retry budget. While other claims run, the
thread sends them once ``FLUSH_S`` has passed since the first one still unsent, as one call; the
last claim to end sends what is left. The bucket is capped, so adding n refunds at once leaves it
where n single refunds would. A refund call that fails is not sent again (it may have been
applied), and a process that dies loses its unsent refunds (at most a second's): the budget is then
a little more careful, never less.

The keeper does not keep a claim forever (docs/design.md "Liveness"): it stops renewing one whose job is
past its deadline by more than ``grace_s``, or whose thread has reported no progress (an answered
status read, a stored output) for ``stall_s``. It marks the claim lost (the thread's next check
raises StaleLease) and lets the lease lapse: the sweeper reconciles the job as a dead worker's.
The job's deadline is on Redis's clock; ``hold`` turns it into an instant on the keeper's own
(monotonic) clock once, from the claim's Redis time, so a host clock that is off does not count.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator

from pipeline.claims import Claim
from pipeline.errors import StaleLease
from pipeline.settings import DEFAULT_DEADLINE_GRACE_SECONDS, DEFAULT_STALL_SECONDS
from pipeline.state.store import Store

log = logging.getLogger(__name__)
#: How often (s) at most the keeper's thread wakes while it holds claims or unsent refunds.
FLUSH_S = 1.0
#: How long (s) a process sends no refund after one found the bucket full.
FULL_S = 10.0


class Held:
    """A claim the keeper renews; ``check`` raises StaleLease once it was fenced out."""

    def __init__(self, claim: Claim, due: float, *, clock: Callable[[], float] = time.monotonic,
                 deadline: float = float("inf")) -> None:
        self.claim, self.due, self.clock = claim, due, clock
        #: The job's deadline on the keeper's clock (inf: none, as for a reconciliation).
        self.deadline = deadline
        #: When the thread last reported progress, on the keeper's clock.
        self.moved = clock()
        self.lost = threading.Event()
        #: A renewal of it is under way (in its own thread).
        self.renewing = False

    def check(self) -> None:
        if self.lost.is_set():
            raise StaleLease("lease lost while running")

    def progress(self) -> None:
        """The thread got somewhere (a status answer, an output stored): it is not stuck."""
        self.moved = self.clock()


class Keeper:
    """Renews the leases this process holds and sends its refunds, from one thread that runs
    while there is something to do."""

    def __init__(self, store: Store, *, lease_ms: int, refund: Callable[[int], object],
                 flush_s: float = FLUSH_S, grace_s: float = DEFAULT_DEADLINE_GRACE_SECONDS,
                 stall_s: float = DEFAULT_STALL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        """``refund(n)`` gives back the retry budget of n successes (True: the bucket is full after it);
        the thread wakes at least every
        ``flush_s`` while it holds claims. A claim is given up ``grace_s`` past its deadline, or
        ``stall_s`` after its thread's last progress. ``clock``: monotonic seconds."""
        self.store, self.lease_ms, self._refund, self.flush_s = store, lease_ms, refund, flush_s
        self.grace_s, self.stall_s, self.clock = grace_s, stall_s, clock
        self._held: set[Held] = set()
        self._refunds = 0
        #: Until when (``clock``) successes send no refund: the last one sent found the bucket full.
        self._full_until = float("-inf")
        #: When the thread sends the unsent refunds (``flush_s`` after the first of them).
        self._flush_at = 0.0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def hold(self, claim: Claim, *, deadline_ms: int | None = None) -> Iterator[Held]:
        """Keep the claim's lease while the block runs, not past the job's ``deadline_ms`` (Redis's
        clock, as the claim's ``claimed_ms``; None: no deadline) plus the grace."""
        now = self.clock()
        deadline = float("inf") if deadline_ms is None else now + (deadline_ms - claim.claimed_ms) / 1000
        held = Held(claim, now + self.lease_ms / 3000, clock=self.clock, deadline=deadline)
        with self._lock:
            self._held.add(held)
            self._running()
        try:
            yield held
        finally:
            with self._lock:
                self._held.discard(held)
                refunds = 0 if self._held else self._refunds
                self._refunds -= refunds
            if refunds:
                self._send(refunds)

    def refund(self) -> None:
        """A success, inside ``hold``: its refund goes out with the thread's next pass, or as the
        last claim ends."""
        with self._lock:
            if self.clock() < self._full_until:
                return
            if not self._refunds:
                self._flush_at = self.clock() + self.flush_s
            self._refunds += 1

    def _running(self) -> None:
        """Start the thread if it is not running (called under the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._held and not self._refunds:
                    self._thread = None
                    return
                now = self.clock()
                live = [held for held in self._held if not held.lost.is_set() and not self._give_up(held, now)]
                due = [held for held in live if held.due <= now and not held.renewing]
                for held in due:
                    held.renewing, held.due = True, now + self.lease_ms / 3000
                refunds = self._refunds if self._refunds and self._flush_at <= now else 0
                self._refunds -= refunds
                # a renewal under way (perhaps hanging) is not due again until it ends: the next pass sees it
                flush = self._flush_at if self._refunds else now + self.flush_s
                wake = min([held.due for held in live if not held.renewing] + [flush])
            for held in due:
                threading.Thread(target=self._renew, args=(held,), name="lease-renewal", daemon=True).start()
            if refunds:
                threading.Thread(target=self._send, args=(refunds,), name="refunds", daemon=True).start()
            time.sleep(max(0.0, wake - self.clock()))

    def _give_up(self, held: Held, now: float) -> bool:
        """Whether to stop renewing the claim: past its deadline plus the grace, or stuck (no
        progress) for ``stall_s``. One given up is marked lost; its lease lapses on its own."""
        if now > held.deadline + self.grace_s:
            why = f"its deadline passed {now - held.deadline:.0f} s ago"
        elif now > held.moved + self.stall_s:
            why = f"its thread made no progress for {now - held.moved:.0f} s"
        else:
            return False
        held.lost.set()
        log.warning("lease of job %s (attempt %d) no longer renewed: %s; the sweeper reconciles it",
                    held.claim.job_id, held.claim.attempt, why)
        return True

    def _renew(self, held: Held) -> None:
        """Any error but a fence is retried at the next renewal."""
        try:
            self.store.heartbeat(held.claim, lease_ms=self.lease_ms)
        except StaleLease:
            held.lost.set()
        except Exception:
            log.warning("heartbeat failed for %s; retrying", held.claim.job_id, exc_info=True)
        finally:
            held.renewing = False

    def _send(self, refunds: int) -> None:
        try:
            if self._refund(refunds) is True:
                with self._lock:
                    self._full_until = self.clock() + FULL_S
        except Exception:
            log.warning("retry budget refund of %d successes failed; not sent again", refunds, exc_info=True)
