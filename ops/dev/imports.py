#!/usr/bin/env python3
"""The import picture of reckon's code: rooms, import levels, edges between rooms, circles.

A room is a package (``pipeline.state``, ``pipeline.work``, ``api``); the modules directly in
``pipeline/`` are the ground. Every import counts, a function's lazy import and one under
``TYPE_CHECKING`` as well: each is a dependency someone must understand.

    python ops/dev/imports.py            # the picture
    python ops/dev/imports.py --check    # exit 1 on a circle, a forbidden edge, or a module or script over 400 lines

``ROOMS`` is the layout's rule (docs/design.md, "Layout"): each room and the rooms it may import.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "api")
MAX_LINES = 400

#: Each room, lowest first, and the rooms it may import besides itself.
ROOMS: dict[str, frozenset[str]] = {
    "pipeline": frozenset(),
    "pipeline.state": frozenset({"pipeline"}),
    "pipeline.blobs": frozenset({"pipeline"}),
    "pipeline.providers": frozenset({"pipeline"}),
    "pipeline.providers.sim": frozenset({"pipeline", "pipeline.providers"}),
    "pipeline.work": frozenset({"pipeline", "pipeline.state", "pipeline.blobs", "pipeline.providers"}),
    "pipeline.webhooks": frozenset({"pipeline", "pipeline.state"}),
    "pipeline.operate": frozenset({"pipeline", "pipeline.state", "pipeline.blobs", "pipeline.providers",
                                   "pipeline.work", "pipeline.webhooks"}),
    "api": frozenset({"pipeline", "pipeline.state", "pipeline.blobs", "pipeline.providers", "pipeline.work",
                      "pipeline.operate", "pipeline.webhooks"}),
    "api.streams": frozenset({"pipeline", "pipeline.state", "api"}),
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of reckon's packages (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def room(name: str, known: dict[str, Path]) -> str:
    """The package a module lives in (a package's ``__init__`` belongs to the package itself)."""
    if known[name].name == "__init__.py":
        return name
    return name.rpartition(".")[0]


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The reckon modules one module imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path = ROOT) -> tuple[dict[str, Path], dict[str, set[str]]]:
    known = modules(root)
    return known, {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:  # only for this walk: a process that runs it (pytest) keeps its own limit for the rest
        for node in sorted(edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(groups)


def levels(edges: dict[str, set[str]]) -> dict[str, int]:
    """Level 1 imports nothing of reckon's; each other module sits one above the highest it imports.

    Members of a circle share one level (the circle counts as one node)."""
    group_of = {member: tuple(group) for group in circles(edges) for member in group}
    level: dict[str, int] = {}

    def of(node: str, seen: frozenset[str]) -> int:
        if node in level:
            return level[node]
        members = group_of.get(node, (node,))
        below = {dep for m in members for dep in edges[m]} - set(members)
        value = 1 + max((of(dep, seen | set(members)) for dep in below if dep not in seen), default=0)
        for member in members:
            level[member] = value
        return value

    for node in edges:
        of(node, frozenset())
    return level


def forbidden(edges: dict[str, set[str]], known: dict[str, Path]) -> list[str]:
    """Edges from a room to one it may not import (rooms outside ``ROOMS`` are not judged)."""
    found = []
    for source, targets in sorted(edges.items()):
        here = room(source, known)
        for target in sorted(targets):
            there = room(target, known)
            if here in ROOMS and there != here and there not in ROOMS[here]:
                found.append(f"{source} -> {target} ({here} may not import {there})")
    return found


def oversized(known: dict[str, Path], root: Path) -> list[str]:
    """Modules (reckon's, the client's, the tests', the operators' and benchmarks' scripts) and Lua scripts
    over ``MAX_LINES`` lines."""
    files = [*known.values(), *sorted((root / "lua").glob("*.lua")), *sorted((root / "ops").rglob("*.py")),
             *sorted((root / "client").rglob("*.py")), *sorted((root / "tests").rglob("*.py"))]
    sizes = {path: len(path.read_text().splitlines()) for path in files}
    return sorted(f"{path.relative_to(root)} ({n} lines)" for path, n in sizes.items() if n > MAX_LINES)


def picture(root: Path = ROOT) -> dict[str, object]:
    known, edges = graph(root)
    rooms: dict[str, list[str]] = defaultdict(list)
    for name in known:
        rooms[room(name, known)].append(name)
    between: dict[tuple[str, str], int] = defaultdict(int)
    for source, targets in edges.items():
        for target in targets:
            if room(source, known) != room(target, known):
                between[(room(source, known), room(target, known))] += 1
    room_edges = {r: {b for (a, b) in between if a == r} for r in rooms}
    sizes = {name: len(path.read_text().splitlines()) for name, path in known.items()}
    return {
        "rooms": {r: sorted(m) for r, m in sorted(rooms.items())},
        "modules": len(known),
        "lines": sum(sizes.values()),
        "edges": sum(len(t) for t in edges.values()),
        "levels": max(levels(edges).values()),
        "between": dict(sorted(between.items())),
        "module_circles": circles(edges),
        "room_circles": circles(room_edges),
        "forbidden": forbidden(edges, known),
        "oversized": oversized(known, root),
    }


def render(p: dict[str, object]) -> str:
    rooms = p["rooms"]
    assert isinstance(rooms, dict)
    lines = [f"{p['modules']} modules, {p['lines']} lines, {p['edges']} import edges, {p['levels']} import levels",
             f"{len(rooms)} rooms:"]
    lines += [f"  {r:<24} {len(m):>2} modules" for r, m in rooms.items()]
    between = p["between"]
    assert isinstance(between, dict)
    lines.append(f"{sum(between.values())} edges between rooms, {len(between)} room pairs:")
    lines += [f"  {a:<24} -> {b:<24} {n:>3}" for (a, b), n in between.items()]
    for title in ("module_circles", "room_circles", "forbidden", "oversized"):
        items = p[title]
        assert isinstance(items, list)
        lines.append(f"{title.replace('_', ' ')}: {len(items)}")
        lines += [f"  {' <-> '.join(item) if isinstance(item, list) else item}" for item in items]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a circle, a forbidden edge or an oversized module")
    args = parser.parse_args(argv)
    p = picture()
    print(render(p))
    broken = any(p[k] for k in ("module_circles", "room_circles", "forbidden", "oversized"))
    return 1 if args.check and broken else 0


if __name__ == "__main__":
    sys.exit(main())
