"""Fleet-wide admission settings an operator changes at run time (``reckon admission set``).

They live in each shard's admission hash (``ShardKeys.admission``: the same values in every shard,
shard 0 written last and read by operators) and the admission script reads them on every request;
a field not set there takes its default from the environment (``FleetLimits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.errors import NotAllowed
from pipeline.settings import (
    DEFAULT_INTERACTIVE_TARGET_SECONDS,
    DEFAULT_PROVIDER_CAP,
    DEFAULT_QUEUE_CAP_BATCH,
    DEFAULT_QUEUE_CAP_INTERACTIVE,
    Settings,
)
from pipeline.state import keys



@dataclass(frozen=True)
class FleetLimits:
    """Admission's fleet-wide figures: the dispatch slots that serve the queue, and the defaults of the
    per-class queue caps and the interactive target wait (``reckon admission set`` overrides these two)."""

    slots: int = DEFAULT_PROVIDER_CAP
    queue_cap_interactive: int = DEFAULT_QUEUE_CAP_INTERACTIVE
    queue_cap_batch: int = DEFAULT_QUEUE_CAP_BATCH
    interactive_target_s: int = DEFAULT_INTERACTIVE_TARGET_SECONDS

    @classmethod
    def of(cls, settings: Settings) -> FleetLimits:
        return cls(sum(settings.caps().values()), settings.queue_cap_interactive, settings.queue_cap_batch,
                   settings.interactive_target_seconds)


def current(client: Any, defaults: FleetLimits) -> dict[str, dict[str, Any]]:
    """Each class's queue cap (and the interactive target wait, s), saying where each comes from."""
    raw = client.hgetall(keys.ShardKeys(0).admission)

    def figure(field: str, default: int) -> dict[str, Any]:
        if field not in raw:
            return {"value": default, "set_by": "environment"}
        try:
            return {"value": int(raw[field]), "set_by": "operator"}
        except ValueError:  # set by hand: the admission script ignores it and applies the default
            return {"value": default, "set_by": "environment", "ignored": raw[field]}

    return {
        "interactive": {"queue_cap": figure("queue_cap:interactive", defaults.queue_cap_interactive),
                        "target_s": figure("target_s:interactive", defaults.interactive_target_s)},
        "batch": {"queue_cap": figure("queue_cap:batch", defaults.queue_cap_batch)},
        "slots": {"value": defaults.slots, "set_by": "environment"},
        "shards": {"value": keys.shard_count(), "set_by": "environment"},  # each refuses above ceil(cap / shards)
    }


def change(client: Any, cls: str, *, queue_cap: int | None = None, target_s: int | None = None,
           reset: bool = False) -> None:
    """Set a class's queue cap or the interactive target wait; ``reset`` returns the class to its defaults."""
    if (queue_cap is not None and queue_cap < 1) or (target_s is not None and target_s < 1):
        raise NotAllowed("a queue cap and a target wait are at least 1")
    if target_s is not None and cls != "interactive":
        raise NotAllowed("the target wait belongs to the interactive class")
    for shard in keys.shards()[::-1]:  # shard 0 last
        if reset:
            client.hdel(shard.admission, f"queue_cap:{cls}", f"target_s:{cls}")
        if queue_cap is not None:
            client.hset(shard.admission, f"queue_cap:{cls}", queue_cap)
        if target_s is not None:
            client.hset(shard.admission, f"target_s:{cls}", target_s)
