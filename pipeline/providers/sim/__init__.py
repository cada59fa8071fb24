"""A simulated ComfyUI for tests, benchmarks and ``make run``: the same HTTP and websocket API as
ComfyUI's ``server.py``, real PNG outputs, injected faults, and a ledger of what it charged.

Imports only ``pipeline.providers`` and the ground. Run it with ``python -m pipeline.providers.sim``.
"""

from pipeline.providers.sim.comfy import png
from pipeline.providers.sim.server import SimServer, start

__all__ = ["SimServer", "png", "start"]
