"""A private RabbitMQ (Debian's ``rabbitmq-server``) on loopback ports, for the broker tests and benchmarks.

Not a system service: the node runs from a temporary directory (config, Mnesia, logs, Erlang cookie),
with its own ``epmd`` on a free port (so Erlang starts no ``epmd -daemon`` that would outlive it), the
AMQP listener and Erlang distribution bound to 127.0.0.1, and both processes stopped by PID on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: Debian installs the real start script here; /usr/sbin/rabbitmq-server only re-runs it as the
#: ``rabbitmq`` user with the system's directories.
SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
#: How long a node may take to accept AMQP connections (it takes about 6 s on this 2-core machine).
DEFAULT_START_SECONDS = 60.0


def missing() -> str | None:
    """Why a private RabbitMQ cannot start here, or None when it can."""
    if not SERVER.exists():
        return f"{SERVER} is absent (Debian package rabbitmq-server; ops/system-deps.sh test installs it)"
    if shutil.which("epmd") is None:
        return "epmd (Erlang) is not on PATH"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM the process group ``proc`` leads (the start script traps it and stops the node), then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def private_rabbitmq(start_seconds: float = DEFAULT_START_SECONDS) -> Iterator[str]:
    """Start a RabbitMQ node and yield its ``amqp://`` URL (user guest, allowed from loopback)."""
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    amqp_port, epmd_port, dist_port = _free_port(), _free_port(), _free_port()
    with tempfile.TemporaryDirectory(prefix="reckon-rabbitmq-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        (work / "rabbitmq.conf").write_text(f"listeners.tcp.1 = 127.0.0.1:{amqp_port}\n")
        (work / "enabled_plugins").write_text("[].\n")
        (work / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's
        env = os.environ | {
            "HOME": str(work / "home"),
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(work / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": "reckon@localhost",
            "RABBITMQ_CONFIG_FILE": str(work / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(work / "mnesia"),
            "RABBITMQ_LOG_BASE": str(work / "log"),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),  # by default the AMQP port + 20000, past 65535 for some
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-kernel inet_dist_use_interface {127,0,0,1}"),
        }
        epmd = subprocess.Popen(["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        server: subprocess.Popen[bytes] | None = None
        try:
            with open(work / "server.out", "wb") as out:
                server = subprocess.Popen([str(SERVER)], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + start_seconds
            while not _accepts(amqp_port):
                if server.poll() is not None or time.monotonic() > deadline:
                    tail = (work / "server.out").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"rabbitmq-server did not accept connections:\n{tail}")
                time.sleep(0.1)
            yield f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"
        finally:
            if server is not None:
                _stop(server)
            _stop(epmd)
