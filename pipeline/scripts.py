"""Loads the Lua scripts in ``lua/`` and names their return codes.

A script is ``lua/<verb>-<nkeys>.lua``; ``lua/_lib.lua`` is prepended to each and its body
runs as a function whose reply travels beside the state changes it made, which the caller
logs (logger ``reckon.state``, one line per change). redis-py's ``Script`` runs them with
EVALSHA and reloads on NOSCRIPT.
"""

from __future__ import annotations

import logging
import re
from enum import IntEnum
from pathlib import Path
from typing import Any, Sequence

import redis

from .errors import IncompleteOutputs, NotAllowed, ScriptError, StaleLease

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
_NAME_RE = re.compile(r"([a-z-]+)-([0-9]+)\.lua")  # fullmatch; \d would take "١" too
#: A script's body runs as a function; ``MOVES`` (lua/_lib.lua) holds the state changes it made.
#: An error reply (``redis.error_reply``) passes through as it is: redis-py raises it.
_BODY = ("local function main()\n{body}\nend\nlocal reply = main()\n"
         "if type(reply) == 'table' and reply.err then return reply end\nreturn {{MOVES, reply}}\n")
#: One field of each state change in ``MOVES``, in order.
_MOVE_FIELDS = ("job", "from", "to", "reason", "attempt", "generation", "error_class")

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


def raise_for(code: Code, reply: Sequence[Any]) -> None:
    """Raise the typed exception for a code that means the write did not happen."""
    if code is Code.STALE_LEASE:
        raise StaleLease("lease generation is no longer current")
    if code is Code.OUTPUTS_MISSING:
        raise IncompleteOutputs(f"{reply[1]} of {reply[2]} outputs stored")
    if code is Code.NOT_CLAIMABLE:
        raise NotAllowed(f"not allowed while the job is {reply[1] or 'absent'}")
    if code is Code.NOT_FOUND:
        raise NotAllowed("no such job")
    raise ScriptError(f"unexpected script reply {code.name}")


class Scripts:
    """The loaded scripts of one Redis client, called by verb with checked key counts."""

    def __init__(self, client: redis.Redis, lua_dir: Path = LUA_DIR) -> None:
        prelude = (lua_dir / "_lib.lua").read_text()
        self._scripts: dict[str, tuple[int, Any]] = {}
        for path in sorted(lua_dir.glob("*.lua")):
            match = _NAME_RE.fullmatch(path.name)
            if not match:
                continue
            verb = match.group(1)
            if verb in self._scripts:
                raise ScriptError(f"two scripts for {verb}")
            source = prelude + "\n" + _BODY.format(body=path.read_text())
            self._scripts[verb] = (int(match.group(2)), client.register_script(source))

    @property
    def verbs(self) -> list[str]:
        return sorted(self._scripts)

    def load(self) -> None:
        """Load every script now (readiness: the server has them cached)."""
        for _, script in self._scripts.values():
            script.registered_client.script_load(script.script)

    def __call__(self, verb: str, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        nkeys, script = self._scripts[verb]
        if len(keys) != nkeys:
            raise ScriptError(f"{verb} takes {nkeys} keys, got {len(keys)}")
        moves, *reply = script(keys=list(keys), args=list(args))
        for move in moves:
            change = dict(zip(_MOVE_FIELDS, map(_text, move), strict=True))
            change["attempt"], change["generation"] = int(change["attempt"]), int(change["generation"])
            state_log.info("state change", extra=change)
        return [_text(item) for item in reply[0]] if reply else []


def _text(item: Any) -> Any:
    return item.decode() if isinstance(item, bytes) else item
