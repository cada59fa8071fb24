"""The provider fleet: named ComfyUI servers, each with a dispatch cap and a price.

``RECKON_PROVIDERS=sage2=http://10.0.0.2:8188,sage3=http://10.0.0.3:8188;cap=3;price=12``
names the servers; a server's options follow its URL after ``;``. Unset, the fleet is one
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
        values = {"cap": cap, "price": price}
        for option in options:
            key, _, value = option.partition("=")
            if key not in values or not value.isascii() or not value.isdigit() or int(value) < 1:
                raise ValueError(f"RECKON_PROVIDERS: bad option {option!r} for {name} (cap=N, price=N)")
            values[key] = int(value)
        servers.append(Server(name, url, values["cap"], values["price"]))
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
