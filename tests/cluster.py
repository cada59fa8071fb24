"""A real Redis Cluster on loopback for tests: three primaries, each its own redis-server process
(``--cluster-enabled yes``), joined by ``redis-cli --cluster create``; stopped by PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis.cluster import ClusterNode, RedisCluster

from pipeline.state import redisconn

#: Shards the state is split into on the test cluster: tags {s0}..{s3} fall on all three primaries.
SHARDS = 4


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@dataclass
class Cluster:
    ports: list[int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def spec(self) -> str:
        """``RECKON_REDIS_CLUSTER``'s value."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def client(self) -> RedisCluster:
        return redisconn.Cluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in self.ports],
                                 decode_responses=True)

    def node(self, port: int) -> subprocess.Popen[bytes]:
        return self.procs[self.ports.index(port)]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


def start(workdir: Path, primaries: int = 3, *, replicas: int = 0) -> Cluster:
    """``primaries`` primaries, each with ``replicas`` replicas (``redis-cli --cluster create
    --cluster-replicas``), every replica's link up before it returns."""
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if exe is None or cli is None:
        raise RuntimeError("redis-server is not installed (make test installs it)")
    cluster = Cluster([_cluster_port() for _ in range(primaries * (1 + replicas))])
    try:
        for port in cluster.ports:
            node_dir = workdir / str(port)
            node_dir.mkdir(parents=True)
            cluster.procs.append(subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--save", "",
                 # a replica's first sync starts at once, not after the 5 s a diskless primary waits for more
                 "--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", str(node_dir)],
                stdout=subprocess.DEVNULL,
            ))
        for port in cluster.ports:
            _wait(lambda p=port: _answers(cli, p, "PING") == "PONG")
        subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in cluster.ports],
                        "--cluster-replicas", str(replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in cluster.ports:
            _wait(lambda p=port: "cluster_state:ok" in _answers(cli, p, "CLUSTER", "INFO"))
            _wait(lambda p=port: "role:master" in (info := _answers(cli, p, "INFO", "replication"))
                  or "master_link_status:up" in info)
        if replicas:  # each primary's replicas have confirmed a write (see replication.confirm_acks)
            for port in cluster.ports:
                if "role:master" in _answers(cli, port, "INFO", "replication"):
                    _wait(lambda p=port: _answers(cli, p, "FLUSHALL") == "OK"
                          and _answers(cli, p, "WAIT", str(replicas), "10000") == str(replicas))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(cli: str, port: int, *command: str) -> str:
    done = subprocess.run([cli, "-p", str(port), *command], capture_output=True, text=True)
    return done.stdout.strip()


def _wait(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("the test cluster did not come up")
        time.sleep(0.05)


def move_slot(cluster: Cluster, slot: int, to_port: int, *, batch: int = 50) -> int:
    """Move one slot to the primary at ``to_port`` as ``redis-cli --cluster reshard`` does (IMPORTING,
    MIGRATING, MIGRATE in batches, then SETSLOT NODE on every node), while clients go on using it;
    returns the keys moved."""
    import redis

    nodes = {port: redis.Redis(port=port, decode_responses=True) for port in cluster.ports}
    try:
        owner = owner_of(cluster, slot)
        source, target = nodes[owner], nodes[to_port]
        source_id, target_id = source.cluster("MYID"), target.cluster("MYID")
        target.cluster("SETSLOT", slot, "IMPORTING", source_id)
        source.cluster("SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        while names := source.cluster("GETKEYSINSLOT", slot, batch):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *names)
            moved += len(names)
        for client in (target, source, *[c for p, c in nodes.items() if p not in (owner, to_port)]):
            client.cluster("SETSLOT", slot, "NODE", target_id)
        return moved
    finally:
        for client in nodes.values():
            client.close()


def owner_of(cluster: Cluster, slot: int, *, default: int | None = None) -> int:
    """The port of the primary that serves ``slot``; ``default`` while none does (a failover)."""
    import redis

    for port in cluster.ports:
        with redis.Redis(port=port, decode_responses=True, socket_timeout=2) as client:
            try:
                if _owns(client, slot):
                    return port
            except redis.ConnectionError:  # a node the test killed
                continue
    if default is None:
        raise LookupError(slot)
    return default


def _owns(client, slot: int) -> bool:  # type: ignore[no-untyped-def]
    myself = client.cluster("MYID")
    for first, last, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
        if first <= slot <= last:
            return primary[2] == myself
    return False
