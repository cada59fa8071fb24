"""ops/redis.conf, as deployed: a command's first call costs Redis no memory beyond what it stores."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import redis

from tests.conftest import free_port, stop_group, wait_until

ROOT = Path(__file__).resolve().parents[1]


def test_a_commands_first_call_allocates_no_latency_histogram(tmp_path: Path) -> None:
    """Redis 7's per-command latency histograms (about 24 kB each, at a command's first call) are off:
    on d89904b's ops/redis.conf each first call below grew ``dataset.bytes`` by about 24 kB."""
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "ops/redis.conf", "--port", str(port),
                             "--dir", str(tmp_path), "--appendonly", "no", "--save", ""],
                            cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(port=port)
    try:
        wait_until(lambda: _pings(client))
        assert client.config_get("latency-tracking") == {"latency-tracking": "no"}
        client.set("warm", "1")  # the connection and the first key's table, out of the figure
        before = int(client.memory_stats()["dataset.bytes"])
        client.hset("h", "f", "1")
        client.zadd("z", {"m": 1})
        client.sadd("s", "m")
        grown = int(client.memory_stats()["dataset.bytes"]) - before
        assert grown < 2_000, grown  # three small keys: a few hundred bytes; with the histograms 98,968 (d89904b)
        assert client.info("latencystats") == {}
    finally:
        client.close()
        stop_group(proc)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
