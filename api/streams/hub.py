"""What wakes the event streams of one process: a reader task per shard following its stream of changes.

Every script that appends a job event adds an entry to its shard's stream of changes
(``reckon:{s<n>}:changes``: ``push_events`` in lua/_lib.lua). One task per shard reads it with
``XREAD BLOCK`` and wakes the rooms concerned: a job's room (its streams then read the job's own
lists, once for all of them) and a tenant's room (its streams take the entries from the reader's
recent ones, or read the stream itself when their cursor is older). An idle shard costs one XREAD
per ``block_ms``, however many streams are open, and none while no stream is open in the process.
See docs/api.md "Event streams".
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from dataclasses import dataclass
from typing import Any, Callable

import orjson
import redis

from pipeline.state import progress
from pipeline.state.keys import ShardKeys

log = logging.getLogger(__name__)

#: How long one XREAD waits for entries (ms): an idle shard costs one command per this much.
DEFAULT_BLOCK_MS = 5_000
#: Entries a reader keeps in memory for the tenant streams (older cursors read Redis).
DEFAULT_RECENT = 10_000
#: Entries read at once, by the reader and by a tenant stream behind it.
PAGE = 1_000
#: After Redis failed, a reader tries again this much later (s).
RETRY_SECONDS = 1.0
#: A stream waits at most this long for its shard's reader to start (s), else 503.
READY_SECONDS = 5.0

#: An entry id of a stream of changes as two integers (ms, sequence), which order as the ids do.
EntryId = tuple[int, int]


def entry_id(text: str) -> EntryId:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def entry_text(entry: EntryId) -> str:
    return f"{entry[0]}-{entry[1]}"


#: An entry's event values, in order, for each kind of event: ``CHANGE_KEYS`` in lua/_lib.lua, the order
#: in which the job's lists hold their keys (a state event's list holds no ``type``); by their count, with
#: ``at`` first or without it (then ``at`` is the entry id's moment).
STATE_KEYS, PROGRESS_KEYS = ("at", "to", "from", "seq", "reason"), ("at", "type", "max", "attempt", "value", "seq", "node")
CHANGE_KEYS = {5: STATE_KEYS, 7: PROGRESS_KEYS, 4: STATE_KEYS[1:], 6: PROGRESS_KEYS[1:]}


@dataclass(frozen=True)
class Change:
    """One entry of a stream of changes: a job event (its JSON as the job's list holds it)."""

    id: EntryId
    job: str
    tenant: str
    raw: str

    @classmethod
    def of(cls, entry: str, fields: dict[str, str]) -> Change:
        """An entry holds the job and its event's values (an entry an earlier version wrote: the
        event's JSON object and the tenant); the tenant is the one the job id names (`<tenant>.<hex>`)."""
        job, raw, at = fields.get("job", ""), fields.get("event", "{}"), entry_id(entry)
        if raw.startswith("["):
            values = orjson.loads(raw)
            names = CHANGE_KEYS.get(len(values), ())
            if names and names[0] != "at":
                names, values = ("at", *names), [at[0], *values]
            raw = orjson.dumps(dict(zip(names, values, strict=True))).decode() if names else "{}"
        return cls(at, job, fields.get("tenant") or job.rpartition(".")[0], raw)


class Trimmed(Exception):
    """Entries after a cursor are no longer kept; ``tail`` is the newest entry id when this was found."""

    def __init__(self, tail: EntryId) -> None:
        super().__init__(entry_text(tail))
        self.tail = tail


class Room:
    """The streams of one job or tenant in this process: woken together, and a job's read once for all."""

    def __init__(self) -> None:
        self.members = 0
        self.version = 0  # raised by every wake
        self._bumped = asyncio.Event()
        self._lock = asyncio.Lock()
        self._read: tuple[int, Any] | None = None  # (version when the read began, its result)

    def wake(self) -> None:
        self.version += 1
        bumped, self._bumped = self._bumped, asyncio.Event()
        bumped.set()

    async def wait(self, seen: int, timeout: float) -> bool:
        """Until a wake after version ``seen``; False if ``timeout`` (s) passed first."""
        if self.version > seen:
            return True
        try:
            await asyncio.wait_for(self._bumped.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def shared(self, seen: int, read: Callable[[], Any]) -> Any:
        """``read()``'s result, begun at version ``seen`` or later: a stream woken at ``seen`` takes
        what another one read since, so one change costs one read however many streams follow it."""
        async with self._lock:
            if self._read is None or self._read[0] < seen:
                began = self.version
                self._read = (began, await read())
            return self._read[1]


class ShardReader:
    """The task that follows one shard's stream of changes and keeps its newest entries."""

    def __init__(self, hub: Hub, shard: int) -> None:
        self.hub, self.key = hub, ShardKeys(shard).changes
        #: Every entry after ``floor`` is in ``recent`` once the reader has read up to it (None: not yet started).
        self.floor: EntryId | None = None
        self.recent: list[Change] = []
        #: Set once the reader knows where it reads from: a stream's first read must come after that, or
        #: an entry added between the two would wake nobody.
        self.ready = asyncio.Event()
        #: Set when a stream joins: a reader with no stream open in the process reads nothing.
        self.wanted = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.run(), name=f"changes {self.key}")

    async def run(self) -> None:
        last: EntryId | None = None
        while True:
            if not self.hub.jobs and not self.hub.tenants:  # nobody to wake: no command until a stream joins
                self.wanted.clear()
                self.ready.clear()
                await self.wanted.wait()
                last = None  # what it held is stale: start again at the newest entry
                continue
            try:
                if last is None:
                    last = self.floor = await self.hub.tail(self.key)
                    self.recent = []
                    if self.ready.is_set():
                        self.hub.wake_all()  # after a failure: every change before the new tail is read anew
                    self.ready.set()
                reply = await self.hub.reader.xread({self.key: entry_text(last)}, count=PAGE,
                                                    block=self.hub.block_ms)
                changes = [Change.of(entry, fields) for _, items in reply or [] for entry, fields in items]
                if len(changes) == PAGE and await self.trimmed_after(last):
                    self.floor, self.recent = changes[0].id, []  # what came before this page: ask Redis
            except redis.RedisError as exc:
                log.warning("stream of changes %s unreadable: %s", self.key, exc)
                # Entries may be trimmed meanwhile: start again at the tail, then wake every stream (above).
                # Its streams wait meanwhile, each trying its own read again (resources.py).
                last = self.floor = None
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if changes:
                last = changes[-1].id
                self.keep(changes)
                self.hub.wake(changes)

    async def trimmed_after(self, last: EntryId) -> bool:
        """Whether entries after ``last`` may have been trimmed before this reader read them (it is a
        page or more behind, so the stream's trimming may have overtaken it): XREAD skips them unseen."""
        try:
            first = (await self.hub.redis.xinfo_stream(self.key)).get("first-entry")
        except redis.ResponseError:  # the stream is gone: its entries with it
            return True
        return bool(first) and entry_id(first[0]) > last

    def keep(self, changes: list[Change]) -> None:
        self.recent += changes
        if len(self.recent) > 2 * self.hub.recent:
            dropped = len(self.recent) - self.hub.recent
            self.floor, self.recent = self.recent[dropped - 1].id, self.recent[dropped:]

    def after(self, cursor: EntryId) -> list[Change] | None:
        """The entries after ``cursor`` it has read, or None when some of them it does not hold."""
        if self.floor is None or cursor < self.floor:
            return None
        at = bisect.bisect_right(self.recent, cursor, key=lambda change: change.id)
        return self.recent[at:at + PAGE]


class Hub:
    """Rooms and shard readers of one process; ``redis`` answers the reads, ``reader`` the blocking XREADs."""

    def __init__(self, redis_client: Any, reader: Any, *, block_ms: int = DEFAULT_BLOCK_MS,
                 recent: int = DEFAULT_RECENT) -> None:
        self.redis, self.reader, self.block_ms, self.recent = redis_client, reader, block_ms, recent
        self.jobs: dict[str, Room] = {}
        self.tenants: dict[str, Room] = {}
        self.shards: dict[int, ShardReader] = {}

    async def join(self, rooms: dict[str, Room], name: str, shard: int) -> Room:
        """The room of ``name`` with one member more, once its shard's reader knows where it reads from
        (started if it was not); redis.TimeoutError if it does not within ``READY_SECONDS``."""
        reader = self.start(shard)
        room = rooms.setdefault(name, Room())
        room.members += 1
        reader.wanted.set()
        try:
            await asyncio.wait_for(reader.ready.wait(), READY_SECONDS)
        except BaseException:
            self.leave(rooms, name)
            if reader.ready.is_set():
                raise
            raise redis.TimeoutError("the stream of changes cannot be read now") from None
        return room

    def start(self, shard: int) -> ShardReader:
        """The shard's reader, started if it was not (every shard's when the process starts)."""
        if shard not in self.shards:
            self.shards[shard] = ShardReader(self, shard)
        return self.shards[shard]

    def leave(self, rooms: dict[str, Room], name: str) -> None:
        room = rooms.get(name)
        if room is not None:
            room.members -= 1
            if room.members <= 0:
                del rooms[name]

    def wake(self, changes: list[Change]) -> None:
        rooms = {id(room): room for change in changes
                 for room in (self.jobs.get(change.job), self.tenants.get(change.tenant)) if room is not None}
        for room in rooms.values():
            room.wake()

    def wake_all(self) -> None:
        for room in [*self.jobs.values(), *self.tenants.values()]:
            room.wake()

    async def snapshot(self, room: Room, seen: int, job_id: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The job's state and every event it keeps, read at version ``seen`` or later (shared)."""
        return await room.shared(seen, lambda: progress.snapshot_async(self.redis, job_id, 0))

    async def changes_after(self, shard: int, cursor: EntryId) -> list[Change]:
        """Entries of the shard after ``cursor``, at most ``PAGE``: the reader's when it holds them all,
        else read from Redis; Trimmed if some were trimmed (the stream keeps its newest ~100,000)."""
        held = self.shards[shard].after(cursor) if shard in self.shards else None
        if held is not None:
            return held
        key = ShardKeys(shard).changes
        pipe = self.redis.pipeline(transaction=True)
        pipe.xinfo_stream(key)
        pipe.xrange(key, min=f"({entry_text(cursor)}", count=PAGE)
        info, items = await pipe.execute(raise_on_error=False)
        if isinstance(info, redis.ResponseError):  # no such key: nothing was ever added (or all of it lost)
            return []
        if isinstance(info, Exception) or isinstance(items, Exception):
            raise info if isinstance(info, Exception) else items
        first = info.get("first-entry")
        trimmed = int(info.get("entries-added", 0)) > int(info["length"])
        if trimmed and first and cursor < entry_id(first[0]):  # trimming takes the oldest: some after cursor went
            raise Trimmed(entry_id(info["last-generated-id"]))
        return [Change.of(entry, fields) for entry, fields in items]

    async def tail(self, key: str) -> EntryId:
        """The newest entry id of a stream of changes ((0, 0) when there is none)."""
        try:
            return entry_id((await self.redis.xinfo_stream(key))["last-generated-id"])
        except redis.ResponseError:  # no such key
            return (0, 0)

    async def close(self) -> None:
        for reader in self.shards.values():
            reader.task.cancel()
        for reader in self.shards.values():
            try:
                await reader.task
            except (asyncio.CancelledError, Exception):
                pass
        self.shards.clear()
