"""The short soak (ops/soak/soak.py --short): 150 jobs through every provider fault, worker
SIGKILLs and a stall, an API kill and a Redis restart, on a stack of its own (its own redis-server).

It must keep every promise: no accepted job lost, provider charges equal to what was settled,
the ledger consistent throughout, nothing stuck.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_short_soak_keeps_every_promise(tmp_path: Path) -> None:
    report = tmp_path / "soak.json"
    argv = [sys.executable, "ops/soak/soak.py", "--short", "--seed", "7", "--workdir", str(tmp_path / "stack"),
            "--json", str(report)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the tool stops its own stack on SIGTERM
        out, _ = proc.communicate(timeout=60)
        pytest.fail("the soak did not finish in 180 s:\n" + out.decode(errors="replace")[-4000:])
    text = out.decode(errors="replace")
    rep = orjson.loads(report.read_bytes())
    assert rep["jobs"]["accepted"] == rep["jobs"]["submitted"] == 150, text[-4000:]
    assert rep["checks"]["lost"]["count"] == 0, text[-4000:]
    failing = {name: check["count"] for name, check in rep["checks"].items() if not check["ok"]}
    assert failing == {}, text[-4000:]
    assert proc.returncode == 0, text[-4000:]
