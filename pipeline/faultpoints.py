"""Named points where crash tests stop a real process before killing it with SIGKILL.

With ``RECKON_PAUSE_AT=<name>`` in its environment, a process that reaches that
point creates the file named by ``RECKON_PAUSE_FILE`` and waits there forever;
the test sees the file and kills the process. Unset (always, in production),
``reached`` is a dictionary lookup and returns at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def reached(name: str) -> None:
    if os.environ.get("RECKON_PAUSE_AT") != name:
        return
    Path(os.environ["RECKON_PAUSE_FILE"]).touch()
    while True:
        time.sleep(3600)
