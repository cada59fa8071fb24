"""`make run`'s stack (ops/run.sh under honcho) prints a status page address that opens: a
development operator token made once in var/ and kept there."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import threading
from pathlib import Path

from tests.conftest import free_port, stop_group, wait_until

ROOT = Path(__file__).resolve().parents[2]
UI_LINE = re.compile(r"status page: http://127\.0\.0\.1:(\d+)/ui\?token=(\S+)")


def _refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _start(var: Path, ports: dict[str, int]) -> tuple[subprocess.Popen[bytes], list[str], threading.Thread]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECKON_")} | {
        "RECKON_VAR": str(var), "PORT": str(ports["web"]), "RECKON_REDIS_PORT": str(ports["redis"]),
        "RECKON_PROVIDER_PORT": str(ports["provider"])}
    proc = subprocess.Popen(["bash", "ops/run.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(line.decode(errors="replace") for line in proc.stdout),
                              daemon=True)
    reader.start()
    return proc, lines, reader


def _get(port: int, path: str) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def _ready(port: int) -> bool:
    try:
        return _get(port, "/readyz")[0] == 200
    except OSError:
        return False


def test_make_run_prints_a_status_page_address_that_opens(tmp_path: Path) -> None:
    var = tmp_path / "var"
    tokens = []
    for _ in range(2):  # the second start keeps the token the first one made
        ports = {"web": free_port(), "redis": free_port(), "provider": free_port()}
        proc, lines, reader = _start(var, ports)
        try:
            wait_until(lambda: any(UI_LINE.search(line) for line in lines), timeout=30)
            [(port, token)] = [m.groups() for line in lines if (m := UI_LINE.search(line))]
            assert int(port) == ports["web"]
            wait_until(lambda: _ready(ports["web"]), timeout=30)
            status, headers = _get(ports["web"], f"/ui?token={token}")
            assert (status, headers["location"]) == (303, "/ui")
            assert headers["set-cookie"].startswith("reckon_operator=")
            assert _get(ports["web"], "/ui?token=wrong")[0] == 401
            tokens.append(token)
        finally:
            stop_group(proc)
            reader.join(timeout=10)
            assert proc.stdout is not None
            proc.stdout.close()
        wait_until(lambda: all(_refuses(p) for p in ports.values()), timeout=15)  # every process stopped
    assert tokens[0] == tokens[1] == (var / "operator-token").read_text().strip()
    assert (var / "operator-token").stat().st_mode & 0o077 == 0  # readable by its owner only
