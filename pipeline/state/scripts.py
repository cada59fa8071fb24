"""Loads the Lua scripts in ``lua/`` as one Redis Functions library and names their return codes.

A script is ``lua/<verb>.lua``; its header says how many keys it takes (``-- keys: N``) and
documents each of them (``KEYS[1]`` to ``KEYS[N]``), which the loader checks, so adding a key
changes one line of the header and no file name. All of them, behind the ``lua/_*.lua`` helpers,
make one library (``FUNCTION LOAD``), named after a hash of its source so
that two versions of reckon never replace each other's: the helpers are defined once when the library loads, not on
every call as a prepended EVAL script's would be. Each script's body runs as a function whose reply
travels beside the state changes it made, which the caller logs (logger ``reckon.state``, one line
per change). A server without the library (a restart without persistence, ``FUNCTION FLUSH``, a new
Cluster node) gets it on the first call that finds it missing, which then runs again.

A durable call (``durable=True``, for the writes that must survive a failover: docs/failover.md) sends ``WAIT <replicas> <timeout>`` right after its FCALL, in one pipeline on one
connection to the server that holds the keys: WAIT covers only the writes of its own connection.
"""

from __future__ import annotations

import hashlib
import logging
import re
from enum import IntEnum
from pathlib import Path
from typing import Any, Sequence

import redis
from redis.cluster import RedisCluster

from pipeline.errors import IncompleteOutputs, JobNotFound, NotAllowed, ReckonError, ScriptError, StaleLease
from pipeline.settings import DEFAULT_ACK_TIMEOUT_MS, Settings
from pipeline.state.redisconn import on_node

LUA_DIR = Path(__file__).resolve().parents[2] / "lua"
_NAME_RE = re.compile(r"[a-z]+(?:-[a-z]+)*\.lua")  # fullmatch; the helpers are lua/_*.lua
_KEYS_RE = re.compile(r"^-- keys: ([0-9]+)( or more)?$", re.MULTILINE)  # [0-9]: \d would take "١" too
_DOCUMENTED_RE = re.compile(r"KEYS\[([0-9]+)\](?: to KEYS\[([0-9]+)\])?")
#: Scripts of ``lua/`` that are not part of the library: the broker's dispatch runs on the
#: broker's own database (``pipeline.work.waking`` loads it).
SEPARATE = frozenset({"broker.lua"})
#: The library: the helpers once, then each script's body registered as a function. A call sets
#: KEYS and ARGV (which scripts read as EVAL's globals), a fresh ``MOVES`` (lua/_lib.lua: the
#: state changes it made, returned beside its reply), ``HELD`` and ``RECORDS`` (the job records it
#: read, written back in one HSET each by ``save_records`` when the body returns), and clears ``G``
#: (a script that forgot ``use_globals`` fails instead of writing to the shard of the call before). An error reply
#: (``redis.error_reply``) passes through as it is: redis-py raises it. Every call is passed two keys beyond
#: its documented ones (``trailing_keys``): its shard's webhook outbox and its stream of changes, read by the
#: library as ``OUTBOX`` and ``CHANGES``.
_LIBRARY = """#!lua name={name}
local KEYS, ARGV = {{}}, {{}}
{prelude}
local function run(body)
  return function(keys, args)
    KEYS, ARGV, MOVES, HELD, G, RECORDS, BUMPS, PACKS, EVENTS = keys, args, {{}}, {{}}, nil, {{}}, {{}}, {{}}, {{}}
    HOOKS, OUTBOX, CHANGED, CHANGES = {{}}, keys[#keys - 1], {{}}, keys[#keys]
    local reply = body()
    pack_finished()
    push_events()
    save_records()
    if type(reply) == 'table' and reply.err then return reply end
    return {{MOVES, reply}}
  end
end
"""
_FUNCTION = "redis.register_function('{function}', run(function()\n{body}\nend))\n"
#: One field of each state change in ``MOVES``, in order.
_MOVE_FIELDS = ("job", "from", "to", "reason", "attempt", "generation", "error_class")

#: A durable call's marker write lives this long (ms): a key per hash tag, ``reckon:{tag}:ack``.
ACK_KEY_MS = 60_000
_TAG_RE = re.compile(r"\{[^}]*\}")

state_log = logging.getLogger("reckon.state")


class Code(IntEnum):
    """Every code a script returns first in its reply."""

    OK = 0
    CREATED = 1
    REPLAYED = 2
    IN_PROGRESS = 3
    FINGERPRINT_MISMATCH = 4
    INSUFFICIENT_ALLOWANCE = 5
    UNKNOWN_TENANT = 6
    NOT_FOUND = 7
    NOT_CLAIMABLE = 8
    STALE_LEASE = 9
    OUTPUTS_MISSING = 10
    NOT_DUE = 11
    CANCELLED = 12
    BUDGET_EXHAUSTED = 13
    EXPIRED = 14
    NO_CAPACITY = 15
    PAUSED = 16
    LIMITED = 17
    INFEASIBLE = 18
    UNSUPPORTED = 19
    PROMPT_KEPT = 20
    INPUT_UNKNOWN = 21
    OVER_QUOTA = 22
    IN_USE = 23


#: The codes of a script that changed state; its other codes are refusals, which write nothing or
#: what is harmless to lose (a counter; a claim's parking or expiry, which its caller acts on only
#: in Redis): a durable call raises ReplicationTimeout only after one of these.
_WROTE = (Code.OK, Code.CREATED, Code.REPLAYED)


class ReplicationTimeout(ReckonError):
    """A durable write happened on the primary, but fewer replicas than required confirmed it
    within the timeout: it is not known to survive a failover. The write stands (the caller logs
    nothing as undone); the reply it gave is ``reply``."""

    def __init__(self, verb: str, acked: int, required: int, reply: list[Any]) -> None:
        super().__init__(f"{verb}: {acked} of {required} replicas confirmed the write in time")
        self.verb, self.acked, self.required, self.reply = verb, acked, required, reply


def raise_for(code: Code, reply: Sequence[Any]) -> None:
    """Raise the typed exception for a code that means the write did not happen."""
    if code is Code.STALE_LEASE:
        raise StaleLease("lease generation is no longer current")
    if code is Code.OUTPUTS_MISSING:
        raise IncompleteOutputs(f"{reply[1]} of {reply[2]} outputs stored")
    if code is Code.NOT_CLAIMABLE:
        raise NotAllowed(f"not allowed while the job is {reply[1] or 'absent'}")
    if code is Code.NOT_FOUND:
        raise JobNotFound("no such job")
    if code is Code.PROMPT_KEPT:
        raise NotAllowed(f"not allowed while server {reply[1]} may still run the job's prompt (its slot is kept): "
                         "resolve it --failed, or --retry once the watcher has heard the prompt ended")
    raise ScriptError(f"unexpected script reply {code.name}")


def key_count(name: str, body: str) -> int:
    """The keys a script takes, from its header (the comment lines it opens with): ``-- keys: N``
    once, and ``KEYS[1]`` to ``KEYS[N]`` each documented, none beyond. ``-- keys: N or more``: a script
    that takes one key more per item it is given (its header says which, after KEYS[N]); see ``variable``."""
    lines = body.splitlines()
    header = "\n".join(lines[:next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))])
    stated = _KEYS_RE.findall(header)
    if len(stated) != 1:
        raise ScriptError(f"lua/{name}: its header must say '-- keys: N' once")
    nkeys = int(stated[0][0])
    documented = {n for first, last in _DOCUMENTED_RE.findall(header)
                  for n in range(int(first), int(last or first) + 1)}
    if documented != set(range(1, nkeys + 1)):
        raise ScriptError(f"lua/{name}: '-- keys: {nkeys}' but its header documents KEYS{sorted(documented)}")
    return nkeys


class Scripts:
    """The loaded scripts of one Redis client, called by verb with checked key counts."""

    def __init__(self, client: redis.Redis, lua_dir: Path = LUA_DIR, *, replicas: int = 0,
                 ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS) -> None:
        #: A durable call waits until this many replicas have its write (0: no WAIT), at most
        #: ``ack_timeout_ms``.
        self.replicas, self.ack_timeout_ms = replicas, ack_timeout_ms
        self.client = client
        prelude = "".join(path.read_text() for path in sorted(lua_dir.glob("_*.lua")))  # lua/_*.lua
        self._variable: set[str] = set()  # verbs of scripts that take N or more keys
        bodies: dict[str, tuple[int, str]] = {}
        for path in sorted(lua_dir.glob("*.lua")):
            if path.name in SEPARATE or path.name.startswith("_"):
                continue
            if not _NAME_RE.fullmatch(path.name):  # an old name (claim-18.lua) or a typo: never silently unloaded
                raise ScriptError(f"lua/{path.name}: a script is named after its verb, lua/<verb>.lua")
            body = path.read_text()
            bodies[path.name.removesuffix(".lua")] = (key_count(path.name, body), body)
            if variable(body):
                self._variable.add(path.name.removesuffix(".lua"))
        functions = {verb: f"{{library}}_{verb.replace('-', '_')}" for verb in bodies}  # named once hashed
        source = _LIBRARY.format(name="{library}", prelude=prelude) + "".join(
            _FUNCTION.format(function=functions[verb], body=body) for verb, (_, body) in bodies.items())
        #: The library's name: ``reckon_`` and a hash of its whole source.
        self.library = f"reckon_{hashlib.sha1(source.encode()).hexdigest()[:12]}"
        self.source = source.replace("{library}", self.library)
        #: verb -> (key count, the name of its function)
        self._scripts = {verb: (nkeys, functions[verb].replace("{library}", self.library))
                         for verb, (nkeys, _) in bodies.items()}

    @property
    def verbs(self) -> list[str]:
        return sorted(self._scripts)

    def load(self, client: Any = None) -> None:
        """Load the library where it is missing (readiness; a server that lacks it): on every primary
        of a Cluster. Asked first, read-only: a server that has it (even one that is full and refuses
        writes) is not asked to load it again."""
        client = client or self.client
        nodes = [node.redis_connection for node in client.get_primaries()] if isinstance(client, RedisCluster) \
            else [client]
        for node in nodes:
            if node.function_list(library=self.library):
                continue
            try:
                node.function_load(self.source)
            except redis.ResponseError as exc:
                if "already exists" not in str(exc):  # loaded meanwhile by another process
                    raise

    @classmethod
    def of(cls, client: redis.Redis, settings: Settings) -> Scripts:
        """The scripts with the settings' durability (RECKON_REPLICAS_TO_ACK, RECKON_ACK_TIMEOUT_MS)."""
        return cls(client, replicas=settings.replicas_to_ack, ack_timeout_ms=settings.ack_timeout_ms)

    def __call__(self, verb: str, keys: Sequence[str], args: Sequence[Any], *, durable: bool = False) -> list[Any]:
        """Run the script; ``durable``: its write must reach ``replicas`` replicas, else
        ReplicationTimeout (after the state changes are logged: they happened)."""
        nkeys, function = self._scripts[verb]
        if len(keys) != nkeys and not (verb in self._variable and len(keys) > nkeys):
            raise ScriptError(f"{verb} takes {nkeys} keys, got {len(keys)}")
        keys = [*keys, *trailing_keys(keys[0])] if keys else []
        acked = self.replicas
        if durable and self.replicas > 0:
            raw, acked = self._run_and_wait(function, list(keys), list(args))
        else:
            raw = self._run(function, keys, args)
        return self._unpack(verb, raw, acked)

    def many(self, verb: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], *,
             durable: bool = False) -> list[list[Any] | Exception]:
        """``verb`` once per (keys, args) of ``calls``, in one pipeline (one round trip) on the server that
        holds the first call's keys: every call's keys share its hash tag. The replies in order, an error
        (a ResponseError, a ReplicationTimeout) in its call's place; ``durable``: one WAIT after them all."""
        nkeys, function = self._scripts[verb]
        commands = []
        for keys, args in calls:
            if len(keys) != nkeys and not (verb in self._variable and len(keys) > nkeys):
                raise ScriptError(f"{verb} takes {nkeys} keys, got {len(keys)}")
            keys = [*keys, *trailing_keys(keys[0])]
            commands.append(("FCALL", function, len(keys), *keys, *args))
        if not commands:
            return []
        wait = durable and self.replicas > 0
        tag = _TAG_RE.search(commands[0][3])

        def run(client: Any) -> list[Any]:
            for _ in range(2):
                with client.pipeline(transaction=False) as pipe:
                    for command in commands:
                        pipe.execute_command(*command)
                    if wait:
                        pipe.set(f"reckon:{tag.group(0) if tag else ''}:ack", "", px=ACK_KEY_MS)
                        pipe.execute_command("WAIT", self.replicas, self.ack_timeout_ms)
                    replies: list[Any] = pipe.execute(raise_on_error=False)
                if not any(isinstance(r, redis.ResponseError) and _missing(r) for r in replies):
                    return replies
                self.load(client)  # every call failed before writing: load the library, run them all again
            return replies

        replies = on_node(self.client, commands[0][3], run)
        acked = self.replicas if not wait else 0 if isinstance(replies[-1], Exception) else int(replies[-1])
        results: list[list[Any] | Exception] = []
        for raw in replies[:len(commands)]:
            try:
                results.append(raw if isinstance(raw, Exception) else self._unpack(verb, raw, acked))
            except ReplicationTimeout as lagging:
                results.append(lagging)
        return results

    def _unpack(self, verb: str, raw: Any, acked: int) -> list[Any]:
        """A call's reply without its state changes, which are logged; ReplicationTimeout for a write
        that fewer than ``replicas`` replicas confirmed."""
        moves, *reply = raw
        for move in moves:
            change = dict(zip(_MOVE_FIELDS, map(_text, move), strict=True))
            change["attempt"], change["generation"] = int(change["attempt"]), int(change["generation"])
            state_log.info("state change", extra=change)
        result = [_text(item) for item in reply[0]] if reply else []
        if acked < self.replicas and result and result[0] in _WROTE:  # a refusal's writes are harmless to lose
            raise ReplicationTimeout(verb, acked, self.replicas, result)
        return result

    def _run(self, function: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return self.client.fcall(function, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            if not _missing(exc):
                raise
        self.load()  # a server without the library (restarted empty, flushed, new): load it, run again
        return self.client.fcall(function, len(keys), *keys, *args)

    def _run_and_wait(self, function: str, keys: list[str], args: list[Any]) -> tuple[Any, int]:
        """FCALL then WAIT in one pipeline (not a transaction: WAIT cannot run inside MULTI) on one
        connection of the server holding ``keys[0]``; (the script's reply, replicas that confirmed).

        WAIT waits for the connection's last write. A script that wrote nothing (a replay of an
        admission another connection wrote) would leave an older offset, so a marker write in the
        keys' own slot (``reckon:{tag}:ack``) carries the offset up to now, on one server and on a
        Cluster node alike."""
        tag = _TAG_RE.search(keys[0])
        marker = f"reckon:{tag.group(0) if tag else ''}:ack"

        def run(client: Any) -> tuple[Any, int]:
            for _ in range(2):
                with client.pipeline(transaction=False) as pipe:
                    pipe.execute_command("FCALL", function, len(keys), *keys, *args)
                    pipe.set(marker, "", px=ACK_KEY_MS)
                    pipe.execute_command("WAIT", self.replicas, self.ack_timeout_ms)
                    reply, _, acked = pipe.execute(raise_on_error=False)
                if not (isinstance(reply, redis.ResponseError) and _missing(reply)):
                    break
                self.load(client)  # a server without the library: load it there, then run once more
            for item in (reply, acked):
                if isinstance(item, Exception):
                    raise item
            return reply, int(acked)

        return on_node(self.client, keys[0], run)


def trailing_keys(key: str) -> tuple[str, str]:
    """The two keys every call is passed last: the webhook outbox and the stream of changes of the shard
    (or hash tag) ``key`` lives in, so that any state change queues its webhook events and its change
    entries in the same step (``push_events`` in lua/_lib.lua)."""
    return outbox_of(key), changes_of(key)


def changes_of(key: str) -> str:
    """The stream of changes of the shard (or hash tag) ``key`` lives in (``ShardKeys.changes``), passed to
    every script after its outbox; a key without a tag is passed as itself, as ``outbox_of`` does."""
    tag = _TAG_RE.search(key)
    return f"reckon:{tag.group(0)}:changes" if tag else key


def outbox_of(key: str) -> str:
    """The webhook outbox of the shard (or hash tag) ``key`` lives in: passed to every script last, beyond
    its documented keys, so that any state change can queue its webhook events in the same step
    (``hook_event`` in lua/_lib.lua; ``ShardKeys.webhook_outbox``). A key without a tag is passed as itself:
    such a script moves no job, so it never writes there."""
    tag = _TAG_RE.search(key)
    return f"reckon:{tag.group(0)}:webhooks:outbox" if tag else key


def variable(body: str) -> bool:
    """Whether a script's header says ``-- keys: N or more``."""
    return any(more for _, more in _KEYS_RE.findall(body))


def _missing(error: redis.ResponseError) -> bool:
    """Whether the server said it has no such function (its library is not loaded there)."""
    return str(error).startswith("Function not found")


def _text(item: Any) -> Any:
    return item.decode() if isinstance(item, bytes) else item
