"""Where a run's Redis bytes go: ``INFO clients`` and ``MEMORY STATS`` before and after it.

``used_memory`` counts everything Redis holds: the keys (``dataset.bytes``: values and their
per-key overhead, ``overhead.hashtable.main``: the main dictionary's table), the clients' buffers
and structs (``clients.normal``: query buffers, reply buffers, one struct each; a connection the
stack opens under load costs Redis up to about 22 kB), and the rest (the AOF and replication
buffers, Lua, Redis's own allocations). ops/bench/deployed.py prints the split per job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

#: Redis shrinks an idle client's reply buffer (16 KB when it connects) by half about every second
#: (``hz`` 10) down to 1 KB: the clients' memory has settled once it held for this long (s).
SETTLED_S = 3.0


@dataclass(frozen=True)
class Snapshot:
    """Redis's memory at one moment (bytes) and its connections."""

    used: int
    clients: int
    clients_bytes: int
    keys: int
    hashtable: int
    dataset: int

    def __sub__(self, other: "Snapshot") -> "Snapshot":
        return Snapshot(*(a - b for a, b in zip(self.fields(), other.fields())))

    def fields(self) -> tuple[int, ...]:
        return (self.used, self.clients, self.clients_bytes, self.keys, self.hashtable, self.dataset)

    def per_job(self, jobs: int) -> str:
        """The delta of a run split per job: keys, clients, the rest."""
        other = self.used - self.clients_bytes - self.dataset
        return (f"{self.used / jobs:.0f} B/job = dataset {self.dataset / jobs:.0f} (main table "
                f"{self.hashtable / jobs:.0f}) + clients {self.clients_bytes / jobs:.0f} + other {other / jobs:.0f};"
                f" {self.keys / jobs:.2f} keys/job; connections {self.clients:+d}")


def snapshot(client: Any) -> Snapshot:
    """``used_memory``, ``connected_clients`` and ``MEMORY STATS``'s parts, over every database."""
    stats = client.memory_stats()
    keys = sum(int(v.get("keys", 0)) for name, v in client.info("keyspace").items() if name.startswith("db"))
    table = sum(int(v["overhead.hashtable.main"]) for name, v in stats.items() if name.startswith("db."))
    return Snapshot(int(client.info("memory")["used_memory"]), int(client.info("clients")["connected_clients"]),
                    int(stats["clients.normal"]), keys, table, int(stats["dataset.bytes"]))


def settled(client: Any, *, timeout: float = 30.0) -> Snapshot:
    """A snapshot once the clients' memory has not fallen for ``SETTLED_S``: connections opened at
    start carry their first buffers for a few seconds, which a baseline must not count."""
    deadline, last = time.monotonic() + timeout, snapshot(client)
    while time.monotonic() < deadline:
        time.sleep(SETTLED_S)
        now = snapshot(client)
        if now.clients_bytes >= last.clients_bytes:
            return now
        last = now
    return last
