"""The layout holds (docs/design.md, "Layout"): no import circle between modules or rooms, no room
importing one above it, no module or Lua script over 400 lines (``ops/dev/imports.py`` prints it)."""

from __future__ import annotations

from ops.dev.imports import ROOMS, picture


def test_no_circle_no_forbidden_edge_no_oversized_module() -> None:
    p = picture()
    assert set(p["rooms"]) == set(ROOMS)  # type: ignore[arg-type]
    assert (p["module_circles"], p["room_circles"], p["forbidden"], p["oversized"]) == ([], [], [], [])
