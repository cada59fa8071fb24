"""What each server can run, as its watcher last read it, and which servers can run a workflow.

The watcher writes a server's offer (pipeline/needs.py ``Offer``) when it connects, after a probe
finds the server back, and every ``RECKON_OFFERS_REFRESH_SECONDS``. Admission asks ``Routes``
which servers can run a job: a server whose offer is not known (not read yet, or a server that does
not say) is taken to run anything, so routing never refuses a job for want of a reading."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import orjson

from pipeline.needs import Missing, Needs, Offer, missing
from pipeline.state import keys


def write(client: Any, server: str, offer: Offer | None, at_ms: int) -> None:
    body = {"at": at_ms, "offer": offer.to_json() if offer is not None else None}
    client.set(keys.server_offers(server), orjson.dumps(body))


def read(client: Any, servers: Iterable[str]) -> dict[str, Offer | None]:
    """Server -> its offer (None: not known); one GET each, pipelined (each key is its own slot)."""
    names = list(servers)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(keys.server_offers(name))
    found = {}
    for name, raw in zip(names, pipe.execute(), strict=True):
        data = orjson.loads(raw) if raw else {}
        found[name] = Offer.from_json(data["offer"]) if data.get("offer") is not None else None
    return found


@dataclass(frozen=True)
class Route:
    """The servers that can run a job (all of them: ``every``), else what the closest one lacks."""

    servers: tuple[str, ...]
    every: bool
    lacking: Missing


class Routes:
    """Which servers can run a workflow, from offers read at most every ``ttl`` seconds."""

    def __init__(self, client: Any, servers: Iterable[str], *, ttl: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.names, self.ttl, self.clock = client, list(servers), ttl, clock
        self._offers: dict[str, Offer | None] = {}
        self._read_at = float("-inf")

    def offers(self) -> dict[str, Offer | None]:
        if self.clock() - self._read_at >= self.ttl:
            self._offers, self._read_at = read(self.client, self.names), self.clock()
        return self._offers

    def route(self, needs: Needs) -> Route:
        lacks = {name: missing(needs, offer) for name, offer in self.offers().items()}
        able = tuple(name for name in self.names if not lacks[name])
        closest = min(lacks.values(), key=len, default=Missing((), ()))
        return Route(able, len(able) == len(self.names), Missing((), ()) if able else closest)
