"""Real redis-server processes for replication tests: a primary, its replicas and Sentinels, each on a
free loopback port with its files in a test's directory, each stopped by its PID.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import redis

from tests.conftest import free_port, wait_until

MASTER = "mymaster"
#: A key the replica set-up writes and deletes at once (confirm_acks).
ACK_PROBE = "reckon-test:ack-probe"


def confirm_acks(primary: redis.Redis) -> None:
    """Wait until every replica of ``primary`` has confirmed a write. A replica just put online
    may leave the first WAIT unanswered until its periodic ACK (up to a second, one sync in three
    here): a test that gives WAIT less than that would fail by chance on its first write. The
    probe key is written and deleted, so the data set is as it was."""
    try:
        replicas = int(primary.info("replication")["connected_slaves"])
        primary.set(ACK_PROBE, 1)
        primary.delete(ACK_PROBE)
        confirmed = primary.execute_command("WAIT", replicas, 10_000)
        if confirmed < replicas:
            raise AssertionError(f"{confirmed} of {replicas} replicas confirmed a write in 10 s")
    finally:
        primary.close()


class RedisProcs:
    """The processes of one replication group; ``stop()`` ends every one still running."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise AssertionError("redis-server is not installed (make test installs it)")
        self.exe, self.workdir = exe, workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinel_ports: list[int] = []

    def server(self, *, replica_of: int | None = None) -> int:
        """Start a redis-server (a replica of ``replica_of``); its port once it answers."""
        port = free_port()
        home = self.workdir / f"redis-{port}"
        home.mkdir()
        argv = [self.exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--repl-diskless-sync-delay", "0", "--dir", str(home)]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._start(port, argv, home)
        if replica_of is not None:  # synced, and counted by the primary's WAIT (online, acking)
            wait_until(lambda: self.client(port).info("replication").get("master_link_status") == "up")
            wait_until(lambda: self._online(replica_of, port))
            confirm_acks(self.client(replica_of))
        return port

    def sentinels(self, primary: int, count: int = 3, *, down_after_ms: int = 1000,
                  failover_timeout_ms: int = 3000) -> list[int]:
        """Start ``count`` Sentinels (quorum: a majority) watching ``primary`` as ``MASTER``."""
        for _ in range(count):
            port = free_port()
            home = self.workdir / f"sentinel-{port}"
            home.mkdir()
            conf = home / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {home}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} {count // 2 + 1}\n"
                f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
                f"sentinel failover-timeout {MASTER} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {MASTER} 1\n")
            self._start(port, [self.exe, str(conf), "--sentinel"], home)
            self.sentinel_ports.append(port)
        # every Sentinel has found the replicas and the other Sentinels: a failover can be agreed
        wait_until(lambda: all(self._sentinel_ready(port, count) for port in self.sentinel_ports), timeout=20)
        return self.sentinel_ports

    def sentinel_url(self, db: int) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER}/{db}"

    def master_port(self) -> int:
        """The port the Sentinels name as the master now."""
        client = self.client(self.sentinel_ports[0])
        try:
            return int(client.sentinel_get_master_addr_by_name(MASTER)[1])
        finally:
            client.close()

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    def _start(self, port: int, argv: list[str], home: Path) -> None:
        with open(home / "log", "ab") as log:
            self.procs[port] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: self._pings(port))

    def _online(self, primary: int, replica: int) -> bool:
        client = self.client(primary)
        try:
            info = client.info("replication")
        finally:
            client.close()
        return any(isinstance(v, dict) and v.get("port") == replica and v.get("state") == "online"
                   for k, v in info.items() if k.startswith("slave"))

    def _pings(self, port: int) -> bool:
        client = self.client(port)
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    def _sentinel_ready(self, port: int, count: int) -> bool:
        client = self.client(port)
        try:
            state = client.execute_command("SENTINEL", "MASTER", MASTER)
            fields = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
            return int(fields["num-other-sentinels"]) == count - 1
        finally:
            client.close()
