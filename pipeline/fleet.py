"""The provider fleet: named ComfyUI servers, each with a dispatch cap and a price.

``RECKON_PROVIDERS=sage2=http://10.0.0.2:8188,sage3=http://10.0.0.3:8188;cap=3;price=12;price_per_second=2``
names the servers; a server's options follow its URL after ``;``: ``cap``, ``price`` (cost units per
output) and ``price_per_second`` (cost units per second of execution, 0 when absent; an attempt costs
both: docs/costs.md "Per-second prices"). Unset, the fleet is one
server, ``comfyui``, at ``RECKON_PROVIDER_URL``. Every worker must be given the same fleet:
the cap of a server is what the claiming worker says it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

#: Prompts in flight on one server: one running plus one queued, so the GPU never waits
#: for reckon between two prompts.
DEFAULT_SERVER_CAP = 2
#: Name of the one server when no fleet is configured.
DEFAULT_SERVER = "comfyui"
NAME_RE = re.compile(r"[a-z0-9_-]{1,40}")


@dataclass(frozen=True)
class Server:
    name: str
    url: str
    cap: int = DEFAULT_SERVER_CAP
    price_per_output: int = 10
    #: Cost units per second the server executes a prompt (its own ``execution_start`` to its end message).
    price_per_second: int = 0


def parse(spec: str, *, default_url: str, cap: int, price: int) -> list[Server]:
    """Servers from a ``RECKON_PROVIDERS`` value; ValueError names what is wrong."""
    if cap < 1:
        raise ValueError("RECKON_PROVIDER_CAP: a server takes at least one prompt")
    if not spec.strip():
        return [Server(DEFAULT_SERVER, default_url, cap, price)]
    servers: list[Server] = []
    for item in spec.split(","):
        name, _, rest = item.strip().partition("=")
        url, *options = rest.split(";")
        if not NAME_RE.fullmatch(name) or not url.startswith(("http://", "https://")):
            raise ValueError(f"RECKON_PROVIDERS: expected name=http://host:port, got {item.strip()!r}")
        values = {"cap": cap, "price": price, "price_per_second": 0}
        for option in options:
            key, _, value = option.partition("=")
            low = 0 if key != "cap" else 1  # price=0 with a price_per_second: priced by the second alone
            if key not in values or not value.isascii() or not value.isdigit() or int(value) < low:
                raise ValueError(f"RECKON_PROVIDERS: bad option {option!r} for {name} "
                                 "(cap=N, price=N, price_per_second=N)")
            values[key] = int(value)
        if not values["price"] and not values["price_per_second"]:
            raise ValueError(f"RECKON_PROVIDERS: {name} has no price (price=N or price_per_second=N)")
        servers.append(Server(name, url, values["cap"], values["price"], values["price_per_second"]))
    if len({s.name for s in servers}) != len(servers):
        raise ValueError("RECKON_PROVIDERS: a server name appears twice")
    return servers


def able(names: Iterable[str], servers: str | None) -> list[str]:
    """The names of ``names`` a job may run on: those its record's ``servers`` field (comma-separated, set
    at admission when not every server can run its workflow) names, else all (lua/_slots.lua
    ``able_servers`` is the same rule inside the scripts)."""
    named = set((servers or "").split(",")) - {""}
    return [name for name in names if name in named] or list(names)


def highest_price(servers: Iterable[Server]) -> int:
    """The price per output a job is reserved at: the highest of the servers it may run on.

    A claim picks the least loaded server when the job is dispatched, so at admission any server
    of the fleet may run any attempt: a reservation at a lower price would leave part of a run on
    a dearer server paid and never booked."""
    return max(server.price_per_output for server in servers)


def highest_per_second(servers: Iterable[Server]) -> int:
    """The price per second a job's seconds are bounded at: the highest of the servers it may run on
    (0: none of them charges by the second)."""
    return max((server.price_per_second for server in servers), default=0)


def attempt_ceiling(servers: Iterable[Server], outputs: int, max_seconds: int) -> int:
    """The most one attempt of ``outputs`` outputs, run for at most ``max_seconds``, can cost on any of
    ``servers``: each server's outputs x its price plus max_seconds x its price per second, the dearest."""
    return max(outputs * s.price_per_output + max_seconds * s.price_per_second for s in servers)


def seconds_units(ms: int, price_per_second: int) -> int:
    """What ``ms`` milliseconds of execution cost at ``price_per_second``: rounded up to the unit (a
    started unit is owed, as the provider's own per-second bill rounds)."""
    return -(-ms * price_per_second // 1000)


def attempt_cost(server: Server, produced: int, seconds_ms: int | None, max_seconds: int) -> tuple[int, int | None]:
    """What one run on ``server`` costs, and the milliseconds booked (None: the server has no price per
    second): every output it made (``produced``: a run is billed whole) at the server's price, plus its
    execution (``seconds_ms``, by the server's own timestamps: what it bills, even past ``max_seconds``
    when an interrupt came late) at its price per second, and ``max_seconds`` when the server gave no
    timestamps (an older server: the bound, never less than it may have billed; docs/costs.md)."""
    units = produced * server.price_per_output
    if not server.price_per_second:
        return units, None
    ms = max_seconds * 1000 if seconds_ms is None else seconds_ms
    return units + seconds_units(ms, server.price_per_second), ms
