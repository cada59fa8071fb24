"""A finished job as one key: its record keeps ``state`` and one compact field, ``z``.

A job that ends completed or cancelled keeps only its record hash: ``state``, and ``z``, which holds
its other fields, attempts, state events and outputs (``pack_finished`` in lua/_lib.lua writes it,
lua/_codec.lua defines it; a test keeps the key lists below in step with the Lua ones). ``z`` is JSON
``[2, created_at, [record values], {other fields}, [attempts], [events], [outputs]]``: record values in
``RECORD_FIELDS`` order (null: no such field, the nulls at the end left out; true: ``id`` or ``tenant``,
named by the job id), an object of any other fields, then items as arrays of their values when their
keys were stored in the order of ``ATTEMPT_KEYS``, ``EVENT_KEYS`` or ``OUTPUT_KEYS``, or were
``ATTEMPT_TIMED_KEYS`` in any order (13 values: an attempt with ``seconds_ms``), else as their stored object, integers as numbers, moments counted from ``created_at`` (the deadline from
``created_at`` + ``deadline_s`` seconds when that is an integer below 10^9); an event of 4 values left out its
``from``, the ``to`` of the event before it (null for the first), one of 3 its ``reason`` too, its ``to``;
an output of 3 values (after its index) its content type, the one before it; an output's sha256 that
starts with ``=`` is 64 hex digits written short (``_digest``). Version 1 has none of these. Progress points and the
workflow go when the job is packed. A failed job (a dead letter) keeps its keys until it is replayed
or purged.

Each reader asks for the live keys and ``z`` in one round trip and takes whichever is there. What a
reader gets is the same either way: record fields as the strings Redis kept, attempts, events and
outputs as the objects they were stored as, keys in the same order.
"""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from pipeline.state.ids import tenant_of

#: The record field that holds a finished job's packed fields and parts.
FIELD = "z"
RECORD_FIELDS = (
    "id", "tenant", "idem_key", "kind", "priority", "outputs_requested", "price", "per_attempt",
    "ceiling", "attempts_allowed", "attempt_count", "attempts_not_sent", "reserved", "charged", "uncertain", "settled",
    "seq", "supersedes", "event_seq", "submitted", "lease_gen", "deadline_s", "deadline", "updated_at", "settled_at",
    "error_class", "error_reason", "error_detail", "cancel_requested", "obsolete", "external_effect",
)
RECORD_TIMES = frozenset({"deadline", "updated_at", "settled_at"})
ATTEMPT_KEYS = ("number", "submitted_at", "price", "worker", "state", "error_class", "started_at", "generation",
                "provider", "ended_at", "operation_id", "server")
#: An attempt a per-second price booked: its 13 values (lua/_codec.lua packs it whatever its keys' stored order).
ATTEMPT_TIMED_KEYS = (*ATTEMPT_KEYS, "seconds_ms")
EVENT_KEYS = ("at", "to", "from", "seq", "reason")
OUTPUT_KEYS = ("sha256", "bytes", "content_type")
ITEM_TIMES = frozenset({"at", "started_at", "submitted_at", "ended_at"})


def record(job_id: str, flat: dict[str, str]) -> dict[str, str]:
    """A record as HGETALL read it, with a packed job's fields unpacked (plain fields win)."""
    raw = flat.pop(FIELD, None)
    return flat if raw is None else {**_fields(job_id, orjson.loads(raw)), **flat}


def hmget_fields(names: Sequence[str]) -> tuple[str, ...]:
    """What to HMGET for ``names`` of a record that may be packed (``values`` reads the reply)."""
    return (*names, FIELD)


def values(job_id: str, names: Sequence[str], reply: Sequence[str | None]) -> list[str | None]:
    """The values of ``names`` from an HMGET of ``hmget_fields(names)``."""
    *plain, raw = reply
    if raw is None:
        return list(plain)
    packed = _fields(job_id, orjson.loads(raw))
    return [value if value is not None else packed.get(name) for name, value in zip(names, plain, strict=True)]


#: The characters of a short digest (``digest_text`` in lua/_codec.lua): each pair is three hex digits.
DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def outputs(live: dict[str, str], raw: str | None) -> dict[int, dict[str, Any]]:
    """Output index -> {sha256, bytes, content_type}, from the job's outputs hash or its packed value."""
    if raw is not None:
        z = orjson.loads(raw)
        found: dict[int, dict[str, Any]] = {}
        before: Any = None  # the content type of the output before
        for item in z[6]:
            if isinstance(item[1], dict):
                found[item[0]], before = item[1], None
                continue
            values = item[1:] if len(item) == 4 else [*item[1:], before]  # 3: the content type before
            found[item[0]] = output = _item(values, OUTPUT_KEYS, 0)
            if z[0] >= 2:
                output["sha256"] = _digest(output["sha256"])
            before = output["content_type"]
        return found
    return {int(index): orjson.loads(value) for index, value in sorted(live.items(), key=lambda kv: int(kv[0]))}


def _digest(text: Any) -> Any:
    """64 hex digits from their short form (``=`` and 43 characters); anything else as it is."""
    if not (isinstance(text, str) and len(text) == 44 and text[0] == "="):
        return text
    values = [DIGITS.index(c) for c in text[1:]]
    pairs = "".join(f"{values[i] * 64 + values[i + 1]:03x}" for i in range(0, 42, 2))
    return pairs + f"{values[42]:x}"


def attempts(live: dict[str, str], raw: str | None) -> list[dict[str, Any]]:
    if raw is not None:
        z = orjson.loads(raw)
        return [_item(item, ATTEMPT_TIMED_KEYS if len(item) == len(ATTEMPT_TIMED_KEYS) else ATTEMPT_KEYS, _base(z))
                for item in z[4]]
    return [orjson.loads(live[n]) for n in sorted(live, key=int)]


def events(live: list[str], raw: str | None) -> list[dict[str, Any]]:
    if raw is None:
        return [orjson.loads(item) for item in live]
    z = orjson.loads(raw)
    found: list[dict[str, Any]] = []
    for item in z[5]:
        if isinstance(item, list) and len(item) in (3, 4):  # its `from` is the `to` before it; 3: its reason its `to`
            reason = item[3] if len(item) == 4 else item[1]
            item = [item[0], item[1], found[-1].get("to") if found else None, item[2], reason]
        found.append(_item(item, EVENT_KEYS, _base(z)))
    return found


def _base(z: list[Any]) -> int:
    return z[1] if isinstance(z[1], int) else 0


def _text(value: Any) -> str:
    return str(value) if isinstance(value, int) else value


_DEADLINE_S = RECORD_FIELDS.index("deadline_s")


def _fields(job_id: str, z: list[Any]) -> dict[str, str]:
    base, fields = _base(z), {} if z[1] is None else {"created_at": _text(z[1])}
    window = z[2][_DEADLINE_S] if z[0] >= 2 and len(z[2]) > _DEADLINE_S else None
    window = window * 1000 if type(window) is int and abs(window) < 10**9 else 0
    for name, value in zip(RECORD_FIELDS, z[2], strict=False):  # a later version may list more
        if value is True:
            fields[name] = job_id if name == "id" else tenant_of(job_id)  # named by the key
        elif value is not None:
            if name == "deadline" and type(value) is int:
                value += window
            fields[name] = _text(value + base if name in RECORD_TIMES and isinstance(value, int) else value)
    fields.update(z[3])
    return fields


def _item(packed: list[Any] | dict[str, Any], names: Sequence[str], base: int) -> dict[str, Any]:
    """A packed item: its values in ``names`` order, or the object it was stored as."""
    if isinstance(packed, dict):
        return packed
    return {name: value + base if name in ITEM_TIMES and type(value) is int else value
            for name, value in zip(names, packed, strict=True)}
