"""The watcher: follows prompts at their servers, so no worker thread waits for a render.

After submission a worker hands its job over (``await``) and is free. One thread per server then:

- gives the server's slot back the moment a prompt ends there (``prompt-ended``), and claims and sends the
  jobs called to it from this process (pipeline/work/dispatch.py), not through the broker;
- listens to the server's websocket (``/ws?clientId=``): ``progress`` becomes a progress event, at most one
  per job every ``progress_interval_seconds`` (``progress.Coalescer``: the newest point waits, and is
  dropped if the prompt ends first); the end of a prompt is collected here (pipeline/work/collecting.py: its
  outputs stored under a new fenced claim, on threads of this process). ComfyUI sends ``execution_success``
  (``_error``, ``_interrupted``) before it writes the prompt's history, and ``executing`` with
  ``node: null`` after: that one is the end (a collect before the history exists finds the prompt still
  running and hands it back);
- renews the leases of the prompts watched there, while the server is in contact; times each prompt from its
  ``execution_start`` to its end (pipeline/work/runclock.py: what the planner's ETAs are made of);
- interrupts a prompt that has run its job's ``max_seconds`` (``RunLimit``: from its ``execution_start``
  heard here, else from its submission on Redis's clock, once per prompt) with the adapter's ``cancel``: it
  then ends ``execution_interrupted`` and its collect fails the job ``max_seconds_exceeded``, booked for
  what ran;
- asks ``/history`` about one watched prompt per tick (at most once a second per server, not per job),
  round-robin: every tick while the websocket is down, and for each prompt every ``watch_recheck_seconds``
  while it is up, so a lost message costs a delay, never a job;
- asks the same way about each prompt a review left at the server with its slot kept (it may still occupy
  the server: lua/_slots.lua ``keep_slot``), and gives the slot back once the server says the prompt ended
  or has no record of it (``ServerSlots.let_go``; a completed one books the review's uncertain hold as
  charged); a kept slot of a server this process is not configured with is left alone (a server just added,
  this process not yet restarted, looks the same as one removed): only the server's own watcher, or an
  operator's ``reckon provider forget SERVER``, gives it back;
- probes a server marked unreachable and clears the mark when it answers;
- reads what the server can run (node classes, model files: pipeline/state/offers.py) when it connects (a
  restarted server is reconnected to), when a probe finds it back, and every ``offers_refresh_seconds``.

While a server does not answer, its watched prompts' leases are not renewed: they expire and the sweeper
moves the jobs to reconciliation, which asks that same server until it answers, or hands the job to an
operator at the age limit. A watcher that dies is the same case. One watcher per server at a time holds a
Redis lock (``reckon:fleet:watcher:``), so a second watcher process is a standby.

Run it: ``python -m pipeline.work.watcher`` (the ``watcher`` process in the Procfile).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from typing import Any, Callable

import orjson
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from pipeline.claims import Claim
from pipeline.errors import ProviderError, StaleLease
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state import keys, offers
from pipeline.state.progress import Coalescer, Record
from pipeline.state.redisconn import name_connections, open_pools
from pipeline.state.store import Store, open_store
from pipeline.work.runclock import RunClock
from pipeline.work.runlimit import RunLimit

log = logging.getLogger(__name__)
#: Threads that run the jobs called to slots this process freed (pipeline/work/dispatch.py), at most.
DISPATCH_THREADS = 4


class ServerWatch:
    """Follows the prompts of one server (see the module's docstring). ``record`` writes a
    progress point; ``clock`` (monotonic seconds) times ticks, renewals and progress writes."""

    def __init__(self, name: str, fleet: Fleet, store: Store, publish: Callable[[str, str], None],
                 settings: Settings, record: Record, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.provider, self.store, self.publish = name, fleet[name], store, publish
        self.settings, self.clock = settings, clock
        self.progress = Coalescer(record, settings.progress_interval_seconds, clock)
        self.url = fleet.servers[name].url.replace("http", "ws", 1).rstrip("/")
        self.caps, self.lease_ms = {name: fleet.servers[name].cap}, int(settings.lease_seconds * 1000)
        self.runs = RunClock(name, store.redis, clock)  # its prompts' run times, for the planner's ETAs
        self.lock = store.redis.lock(keys.watcher_lock(name), timeout=settings.lease_seconds, blocking=False,
                                     thread_local=False)
        self.watched: dict[str, dict[str, Any]] = {}  # job id -> {server, gen, op, attempt}
        self.kept: dict[str, dict[str, Any]] = {}  # `<job id>/<operation id>` -> {server, since}: slots kept
        self.checked: dict[str, float] = {}  # job id or kept slot -> when /history was last asked (monotonic)
        self.renewed: dict[str, float] = {}
        self.cancelling: dict[str, int] = {}  # job id -> generation whose cancel was passed on
        self.late: dict[str, int] = {}  # job id -> generation found past its deadline
        self.limits: dict[str, tuple[str, RunLimit]] = {}  # job id -> (operation id, its max_seconds clock)
        self.contact, self.connected = 0.0, False  # when the server last answered (monotonic); the websocket up
        self._next_tick = self._next_probe = self._held_until = self._next_offers = 0.0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if not self._hold():
                    stop.wait(self.settings.watch_poll_seconds)
                    continue
                self._listen(stop)
            except Exception:  # keep watching: one bad message or Redis blip must not stop it
                log.exception("watcher of %s failed; going on", self.name)
                stop.wait(self.settings.watch_poll_seconds)
        if self.lock.owned():
            self.lock.release()

    def _hold(self) -> bool:
        """Hold the server's watcher lock (another process may be watching it), renewing it every
        third of its length rather than on every message."""
        now = self.clock()
        if now < self._held_until:
            return True
        held = bool(self.lock.reacquire() if self.lock.owned() else self.lock.acquire())
        self._held_until = now + self.settings.lease_seconds / 3 if held else 0.0
        return held

    def _listen(self, stop: threading.Event) -> None:
        """Follow the websocket while it is up; tick without it while it is down."""
        try:
            keepalive = self.settings.lease_seconds / 4  # a dead socket is noticed well within a lease
            with connect(f"{self.url}/ws?clientId={self.provider.client_id}", open_timeout=5, close_timeout=1,
                         ping_interval=keepalive, ping_timeout=keepalive, max_size=2**22, proxy=None) as ws:
                self.connected = True
                self.checked.clear()  # what ended while we were away is asked about now
                self._next_offers = 0.0  # perhaps a new process life: what it can run is read again
                while not stop.is_set() and self._hold():
                    try:
                        self.on_message(ws.recv(timeout=self.settings.watch_poll_seconds))
                    except TimeoutError:
                        pass
                    self.contact = self.clock()  # open and answering pings: the server is there
                    self.tick()
        except (OSError, WebSocketException, TimeoutError) as exc:
            if self.connected:
                log.info("websocket of %s closed (%s); asking /history meanwhile", self.name, type(exc).__name__)
        self.connected = False
        self.tick()
        stop.wait(self.settings.watch_poll_seconds)

    def on_message(self, raw: str | bytes) -> None:
        """One websocket frame: a progress point, or the end of a prompt (a collect); the rest is skipped."""
        if isinstance(raw, bytes):  # preview images: not ours to keep
            return
        try:
            self._handle(orjson.loads(raw))
        except (ValueError, TypeError, AttributeError, KeyError):  # unreadable: /history covers it
            log.info("watcher of %s: unreadable websocket message skipped", self.name)

    def _handle(self, message: dict[str, Any]) -> None:
        kind, data = message.get("type"), message.get("data") or {}
        ended = kind == "executing" and data.get("node") is None
        if kind not in ("progress", "execution_start") and not ended:
            return
        job_id = self._job_of(str(data.get("prompt_id", "")))
        if job_id is None:
            return
        if kind == "execution_start":
            self._running(job_id, heard=True)
            self.runs.started(job_id, self.watched[job_id].get("ckpt"))
        elif kind == "progress":
            entry = self.watched[job_id]
            self.progress.offer(job_id, entry["attempt"], entry["op"], str(data.get("node", "")),
                                int(data.get("value", 0)), int(data.get("max", 0)))
        else:
            self._ended(job_id)
            self._collect(job_id)

    def _job_of(self, operation_id: str) -> str | None:
        for attempt in range(2):  # a prompt handed over since the last refresh: read the list again
            for job_id, entry in self.watched.items():
                if entry["op"] == operation_id:
                    return job_id
            if attempt == 0:
                self.refresh()
        return None

    def refresh(self) -> None:
        watched, kept = self.store.prompts()
        self.watched = {job_id: entry for job_id, entry in watched.items() if entry["server"] == self.name}
        self.kept = {slot: entry for slot, entry in kept.items() if entry["server"] == self.name}
        for seen in (self.checked, self.renewed, self.cancelling, self.late, self.limits):
            for job_id in [j for j in seen if j not in self.watched and j not in self.kept]:
                del seen[job_id]
        self.progress.keep_only(self.watched)

    def _cancels(self) -> None:
        """A watched job whose client cancelled (its watch entry says so: lua/cancel.lua, await.lua):
        a worker takes its prompt off the server (collect)."""
        for job_id, entry in list(self.watched.items()):
            if entry.get("cancel") and self.cancelling.get(job_id) != entry["gen"]:
                self.cancelling[job_id] = entry["gen"]  # once per hand-over
                self._collect(job_id)

    def _running(self, job_id: str, heard: bool = False) -> None:
        """The job's prompt is running at the server: its ``max_seconds`` count once per prompt (a new
        hand-over of the same prompt keeps the count), from now when this watcher ``heard`` it start, else
        from its submission on Redis's clock (``sub``): a watcher that took over, or missed the start,
        never lets it run longer, though it may stop one that waited in the server's queue sooner."""
        entry = self.watched[job_id]
        if not entry.get("max") or self.limits.get(job_id, ("",))[0] == entry["op"]:
            return
        since = self.clock()
        if not heard and entry.get("sub"):
            since -= max(0, self.store.server_ms(keys.JobKeys(job_id).shard) - entry["sub"]) / 1000
        self.limits[job_id] = (entry["op"], RunLimit(entry["max"], self.clock, since))

    def _limits(self) -> None:
        """Interrupt, once, each prompt that has run its job's ``max_seconds`` (its collect books what ran)."""
        for job_id, (op, limit) in list(self.limits.items()):
            entry = self.watched.get(job_id)
            if entry is None or entry["op"] != op or not limit.due("running"):
                continue
            log.info("prompt of %s ran past its max_seconds at %s; interrupting it", job_id, self.name)
            try:
                self.provider.cancel(entry["op"])
            except ProviderError as exc:  # asked again at the next tick
                limit.done = False
                log.info("watcher of %s: interrupt unanswered (%s)", self.name, exc.reason)

    def tick(self) -> None:
        """Write the progress points now due; at most once per poll interval: renew leases, ask
        about one prompt, probe if marked."""
        now = self.clock()
        self.progress.flush()
        self.runs.flush(self.watched)
        if now < self._next_tick:
            return
        self._next_tick = now + self.settings.watch_poll_seconds
        self.refresh()
        self._cancels()
        self._limits()
        if self.store.provider_block(self.name) == "provider_unreachable":
            return self._probe(now)
        if now >= self._next_offers:
            self.read_offers(now)
        self._check_one(now)
        if self.clock() - self.contact < self.settings.lease_seconds / 2:
            self._renew(now)

    def _renew(self, now: float) -> None:
        """Renew the leases of the prompts watched here, except past a job's deadline: there a
        collect decides (the prompt goes to reconciliation, as a worker's own wait would)."""
        clocks: dict[keys.ShardKeys, int] = {}  # a deadline is read on the clock of its shard's primary
        for job_id, entry in self.watched.items():
            shard = keys.JobKeys(job_id).shard
            if shard not in clocks:
                clocks[shard] = self.store.server_ms(shard)
            if clocks[shard] >= entry.get("deadline", float("inf")):
                if self.late.get(job_id) != entry["gen"]:
                    self.late[job_id] = entry["gen"]
                    self._collect(job_id)
                continue
            if now - self.renewed.get(job_id, 0.0) < self.settings.lease_seconds / 3:
                continue
            try:
                self.store.heartbeat(Claim(job_id, entry["gen"], entry["attempt"], entry["op"]),
                                     lease_ms=self.lease_ms)
                self.renewed[job_id] = now
            except StaleLease:  # collected, reconciled or finished meanwhile
                self.renewed.pop(job_id, None)

    def _check_one(self, now: float) -> None:
        """Ask /history about the watched or kept prompt asked about least recently, if it is due."""
        every = self.settings.watch_recheck_seconds if self.connected else 0.0
        due = [job_id for job_id in [*self.watched, *self.kept] if now - self.checked.get(job_id, 0.0) >= every]
        if not due:
            return
        job_id = min(due, key=lambda j: self.checked.get(j, 0.0))
        self.checked[job_id] = now
        kept = job_id in self.kept
        try:
            state = self.provider.status(job_id.partition("/")[2] if kept else self.watched[job_id]["op"]).state
        except ProviderError as exc:
            log.info("watcher of %s: /history unanswered (%s)", self.name, exc.reason)
            if exc.error_class == "provider_unreachable":
                self.store.block_provider(self.name, "provider_unreachable")
            return
        self.contact = self.clock()
        if state == "running" and not kept:  # its execution_start may have been missed
            self._running(job_id)
        if state in ("pending", "running"):
            return
        if kept:  # ended, or no record of it (a restart empties the queue): it no longer occupies the server
            self._let_go(job_id, self.name, state)
            return
        if state != "unknown":  # ended: the server is free (unknown: a worker asks and decides)
            self._ended(job_id)
        self._collect(job_id)

    def _let_go(self, slot: str, server: str, state: str) -> None:
        """Give back the slot a review kept for a prompt (``slot``: ``<job id>/<operation id>``) that the
        server says is in ``state`` (ended, or unknown to it), and call the jobs parked for it."""
        given = self.store.slots.let_go(slot, server, completed=state == "completed")
        self.kept.pop(slot, None)
        if given:  # else another watcher, or an earlier check, gave it back
            log.info("slot of %s on %s given back: the server says %s", slot.partition("/")[0], server, state)
            self._unpark()

    def _probe(self, now: float) -> None:
        if now < self._next_probe:
            return
        self._next_probe = now + self.settings.probe_seconds
        try:
            self.provider.epoch()
        except ProviderError:
            return
        self.contact = self.clock()
        self._next_offers = 0.0  # back: perhaps restarted with other nodes or models
        if self.store.clear_provider(self.name, ["provider_unreachable"]):
            log.info("server %s answers again; dispatch resumes", self.name)
            self._unpark()

    def _unpark(self) -> None:
        """Call the parked jobs of every shard that this server's free slots can take (the shards in turn,
        starting one further each time: pipeline/state/calls.py)."""
        for job_id in self.store.calls.sweep(self.caps, batch_wait_ms=self.settings.batch_max_wait_seconds * 1000):
                self.publish(job_id, "unparked")

    def read_offers(self, now: float) -> None:
        """Store what the server can run (its node classes and model files); asked again after a
        probe's interval if it does not answer."""
        try:
            offer = self.provider.offers()
        except ProviderError as exc:
            log.info("watcher of %s: what it can run is unread (%s)", self.name, exc.reason)
            self._next_offers = now + self.settings.probe_seconds
            return
        offers.write(self.store.redis, self.name, offer, self.store.server_ms())
        self._next_offers = now + self.settings.offers_refresh_seconds

    def _ended(self, job_id: str) -> None:
        """The job's prompt ended at the server: its slot is free now (collecting is not GPU work), and the
        jobs parked for a slot are called to it (docs/fleet.md "The slot is the GPU")."""
        entry = self.watched[job_id]
        claim = Claim(job_id, entry["gen"], entry["attempt"], entry["op"], server=self.name)
        self.runs.ended(job_id)
        parked = self.store.slots.ended(claim)
        if parked is None:  # given back already
            return
        wait_ms = self.settings.batch_max_wait_seconds * 1000
        for called in self.store.calls.after_free(keys.JobKeys(job_id).shard, parked, self.caps, batch_wait_ms=wait_ms):
            self.publish(called, "unparked")

    def _collect(self, job_id: str) -> None:
        """Collect the job (``publish``: here, pipeline/work/collecting.py); a progress point still pending
        is dropped (what the collect makes of the job, a completion most often, says more)."""
        self.progress.drop(job_id)
        log.info("prompt of %s ended at %s; collecting", job_id, self.name)
        self.publish(job_id, "collect")


class Watcher:
    """One ``ServerWatch`` thread per server of the fleet."""

    def __init__(self, fleet: Fleet, store: Store, publish: Callable[[str, str], None], settings: Settings,
                 record: Record) -> None:
        self.watches = [ServerWatch(server.name, fleet, store, publish, settings, record) for server in fleet]

    def run(self, stop: threading.Event) -> None:
        threads = [threading.Thread(target=w.run, args=(stop,), name=f"watch-{w.name}") for w in self.watches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def main() -> None:
    from pipeline.logs import configure
    from pipeline.state.progress import record
    from pipeline.work.actors import adapter, executor, router
    from pipeline.work.broker import Publisher, build_broker
    from pipeline.work.collecting import COLLECT_THREADS, LocalCollect
    from pipeline.work.dispatch import LocalDispatch

    configure("watcher")
    name_connections("watcher")  # before any client is made: the broker's and the executor's are named too
    settings = Settings.from_env()
    store = open_store(settings)
    fleet = Fleet(settings.servers(), adapter)
    threads, collects = min(len(fleet.servers), DISPATCH_THREADS), min(len(fleet.servers), COLLECT_THREADS)
    dispatch = LocalDispatch(executor, router, Publisher(build_broker(settings)), threads)
    publish = LocalCollect(executor, router, dispatch, collects)  # collects here; called jobs to the dispatch
    watcher = Watcher(fleet, store, publish, settings, lambda *point: record(store.scripts, *point))
    try:
        executor()  # the dispatch's: its store, and its lease keeper's 2 threads
    except Exception as exc:  # Redis not answering: the first called job builds it
        log.warning("executor not built at start", extra={"error": type(exc).__name__})
    # a thread per server, per dispatch and per collect, and the keeper's: their connections open now
    open_pools(len(watcher.watches) + threads + collects + 2, len(watcher.watches) + threads + collects)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("watching %s (%s)", ", ".join(fleet.servers), socket.gethostname())
    watcher.run(stop)
    publish.close()
    dispatch.close()


if __name__ == "__main__":
    main()
