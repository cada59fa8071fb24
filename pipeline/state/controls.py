"""The fleet's stops (a server paused, unreachable or refusing our credentials; a class paused) and
the providers' shared retry budget: the mixin ``Store`` inherits."""

from __future__ import annotations

from typing import Sequence

from pipeline.state.keys import SERVER_BLOCKS, ProviderKeys
from pipeline.state.scripts import Code
from pipeline.state.sweeps import Sweeps


class Controls(Sweeps):
    """Operator and worker controls of dispatch, set in every shard's fleet hash."""

    def budget(self, provider: str, operation: str, tokens: float, capacity: float) -> bool:
        reply = self.scripts("budget", [ProviderKeys(provider).budget], [operation, tokens, capacity])
        return Code(reply[0]) is Code.OK

    def refund_budget(self, provider: str, tokens: float, capacity: float) -> bool:
        """Give ``tokens`` back to the provider's retry budget; True if the bucket is full after it."""
        reply = self.scripts("budget", [ProviderKeys(provider).budget], ["refund", tokens, capacity])
        return float(reply[1]) >= capacity

    def block_provider(self, server: str, reason: str, *, now_ms: int | None = None) -> bool:
        """Stop dispatch to a server (one of ``SERVER_BLOCKS``) until cleared; False if it already was."""
        if reason not in SERVER_BLOCKS:
            raise ValueError(f"unknown block reason {reason!r}")
        return self._fleet_setnx(f"{reason}:{server}", now_ms)

    def provider_block(self, server: str) -> str | None:
        """Why dispatch to the server is stopped (the first reason, in any shard), or None."""
        found = self._each_shard(lambda pipe, shard: pipe.hmget(shard.fleet, [f"{r}:{server}" for r in SERVER_BLOCKS]))
        return next((reason for i, reason in enumerate(SERVER_BLOCKS) if any(marks[i] for marks in found)), None)

    def pause_class(self, priority: str, *, now_ms: int | None = None) -> bool:
        """Stop claims and submissions of the class's jobs (admission goes on); False if it already was."""
        return self._fleet_setnx(f"pause_class:{priority}", now_ms)

    def resume_class(self, priority: str) -> bool:
        return self._fleet_del([f"pause_class:{priority}"])

    def clear_provider(self, server: str, reasons: Sequence[str] = SERVER_BLOCKS) -> bool:
        """Let dispatch to the server resume (for ``reasons``); False if it was not stopped for them."""
        return self._fleet_del([f"{reason}:{server}" for reason in reasons])

    def _fleet_setnx(self, field: str, now_ms: int | None) -> bool:
        """Set a stop in every shard's fleet hash (each shard's scripts read their own); True if some
        shard did not have it yet. Readers take a stop set in any shard as set, so one that a writer
        left half-written (it died midway) shows, and is cleared, as a whole."""
        since = self.server_ms() if now_ms is None else now_ms
        return any(self._each_shard(lambda pipe, shard: pipe.hsetnx(shard.fleet, field, since)))

    def _fleet_del(self, fields: list[str]) -> bool:
        """Clear stops in every shard; True if some shard had any of them."""
        return any(self._each_shard(lambda pipe, shard: pipe.hdel(shard.fleet, *fields)))
