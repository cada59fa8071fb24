"""The servers one process dispatches to, each with the adapter that speaks to it."""

from __future__ import annotations

from typing import Callable, Iterator

from pipeline.fleet import Server
from pipeline.providers.base import Provider


class Fleet:
    """The servers this process dispatches to, each with its adapter."""

    def __init__(self, servers: list[Server], adapter: Callable[[Server], Provider]) -> None:
        self.servers = {server.name: server for server in servers}
        self._adapters = {server.name: adapter(server) for server in servers}

    def __getitem__(self, name: str) -> Provider:
        return self._adapters[name]

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def __iter__(self) -> Iterator[Server]:
        return iter(self.servers.values())

    def caps(self) -> dict[str, int]:
        """Server name -> dispatch cap, what a claim and an unpark take."""
        return {server.name: server.cap for server in self}

    def prices(self) -> dict[str, int]:
        """Server name -> price per output: a claim records its server's on the attempt."""
        return {server.name: server.price_per_output for server in self}
