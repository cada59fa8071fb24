"""What a job's record says was booked for it, by attempt and by id: the fields the money scripts write
beside its others (lua/_lib.lua ``charge_attempt`` and ``resolve_hold``, lua/adjust.lua), read the same
whether the job is live or packed (pipeline/state/archive.py unpacks them like any other field), and
fixed names, so the views read them with HMGET (pipeline/state/views.py).

- ``charges``: ``<attempt> <units> <server>`` per attempt the provider charged, comma separated;
- ``holds``: ``<attempt> <units> charged|released <server>`` per uncertain hold resolved, comma separated;
- ``adjustments``: a JSON array of ``{id, units, attempt, reason, at}``; ``adjusted``: their sum.
"""

from __future__ import annotations

from typing import Any

import orjson


def booking_id(kind: str, job_id: str, attempt: int) -> str:
    """The id of an attempt's charge (``charge``) or of its hold's resolution (``uncertain``)."""
    return f"{kind}:{job_id}:{attempt}"


def charges(record: dict[str, str]) -> list[dict[str, Any]]:
    """Each attempt's charge, by attempt: attempt, server, units."""
    found = []
    for entry in filter(None, (record.get("charges") or "").split(",")):
        attempt, units, server = (entry.split(" ", 2) + [""])[:3]
        found.append({"attempt": int(attempt), "server": server or None, "units": int(units)})
    return sorted(found, key=lambda c: c["attempt"])


def holds(record: dict[str, str]) -> list[dict[str, Any]]:
    """Each resolved uncertain hold, by attempt: attempt, server, units (0 when released), outcome, held."""
    found = []
    for entry in filter(None, (record.get("holds") or "").split(",")):
        attempt, units, outcome, server = (entry.split(" ", 3) + ["", ""])[:4]
        found.append({"attempt": int(attempt), "server": server or None, "outcome": outcome,
                      "units": int(units) if outcome == "charged" else 0, "held": int(units)})
    return sorted(found, key=lambda h: h["attempt"])


def adjustments(record: dict[str, str]) -> list[dict[str, Any]]:
    """The job's adjustments, oldest first: id, attempt (0: the job), units, reason, at (ms)."""
    found = orjson.loads(record["adjustments"]) if record.get("adjustments") else []
    return sorted(found, key=lambda a: (a["at"], a["id"]))


def seconds(attempt: dict[str, Any]) -> float | None:
    """The seconds an attempt record says it was booked for: ``seconds_ms`` (ms, issue 32 section 1's field)
    as seconds, or ``seconds``; None when it has neither."""
    if attempt.get("seconds_ms") is not None:
        return int(attempt["seconds_ms"]) / 1000
    return attempt.get("seconds")
