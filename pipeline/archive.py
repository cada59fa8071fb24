"""A finished job as one key: what ``pack_finished`` (lua/_lib.lua) keeps in its record.

A job that ends completed or cancelled keeps only its record hash. Its attempts, state events and
outputs move into the record's field ``archive``: JSON ``{"a": [attempt, ...], "e": [event, ...],
"o": {"<index>": output}}``, each item the very JSON it was stored as, so a reader decodes the same
objects as it did from the job's own keys while it ran. Progress points and the workflow go then.
A failed job (a dead letter) keeps its keys until it is replayed or purged.

Each reader asks for the live key and the archive in one round trip and takes whichever is there.
"""

from __future__ import annotations

from typing import Any

import orjson

#: The record field that holds a finished job's packed parts.
FIELD = "archive"


def parts(raw: str | None) -> dict[str, Any] | None:
    """The packed parts of a finished job, or None while it is live (or a dead letter)."""
    return None if raw is None else orjson.loads(raw)


def outputs(live: dict[str, str], archive: str | None) -> dict[int, dict[str, Any]]:
    """Output index -> {sha256, bytes, content_type}, from the job's outputs hash or its archive."""
    packed = parts(archive)
    if packed is not None:
        return {int(index): output for index, output in packed["o"].items()}
    return {int(index): orjson.loads(value) for index, value in sorted(live.items(), key=lambda kv: int(kv[0]))}


def attempts(live: dict[str, str], archive: str | None) -> list[dict[str, Any]]:
    packed = parts(archive)
    if packed is not None:
        return packed["a"]
    return [orjson.loads(live[n]) for n in sorted(live, key=int)]


def events(live: list[str], archive: str | None) -> list[dict[str, Any]]:
    packed = parts(archive)
    if packed is not None:
        return packed["e"]
    return [orjson.loads(item) for item in live]
