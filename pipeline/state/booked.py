"""What a job's record says was booked for it, by attempt and by id: the fields the money scripts write
beside its others (lua/_lib.lua ``charge_attempt`` and ``resolve_hold``, lua/adjust.lua), read the same
whether the job is live or packed (pipeline/state/archive.py unpacks them like any other field).

- ``u:<attempt>`` = ``<units> <server>``: what the provider charged for the attempt;
- ``h:<attempt>`` = ``<units> charged|released <server>``: the attempt's uncertain hold, resolved;
- ``a:<booking id>`` = JSON ``{units, attempt, reason, at}``: an adjustment.
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
    for name, value in record.items():
        if name.startswith("u:"):
            units, _, server = value.partition(" ")
            found.append({"attempt": int(name[2:]), "server": server or None, "units": int(units)})
    return sorted(found, key=lambda c: c["attempt"])


def holds(record: dict[str, str]) -> list[dict[str, Any]]:
    """Each resolved uncertain hold, by attempt: attempt, server, units (0 when released), outcome."""
    found = []
    for name, value in record.items():
        if name.startswith("h:"):
            units, outcome, server = (value.split(" ", 2) + ["", ""])[:3]
            found.append({"attempt": int(name[2:]), "server": server or None, "outcome": outcome,
                          "units": int(units) if outcome == "charged" else 0, "held": int(units)})
    return sorted(found, key=lambda h: h["attempt"])


def adjustments(record: dict[str, str]) -> list[dict[str, Any]]:
    """The job's adjustments, oldest first: id, attempt (0: the job), units, reason, at (ms)."""
    found = [{"id": name[2:], **orjson.loads(value)} for name, value in record.items() if name.startswith("a:")]
    return sorted(found, key=lambda a: (a["at"], a["id"]))
