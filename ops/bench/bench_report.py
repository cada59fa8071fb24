"""The report of ops/bench/bench.py: each phase gives a ``Section`` of rows, printed as one table per
section at the end of the run and written as JSON with ``--json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One measure: the first column's figure (the bare baseline, or the small backlog in the
    growth phase), reckon's, the issue's target for it and whether this run met it."""

    measure: str
    first: float | None
    reckon: float
    target: str = ""
    met: bool | None = None

    @property
    def ratio(self) -> float | None:
        return self.reckon / self.first if self.first else None


@dataclass
class Section:
    """A phase's figures. ``change`` shows reckon's change from the first column in %, not the ratio."""

    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: tuple[str, str] = ("bare", "reckon")
    change: bool = False

    def render(self) -> list[str]:
        first, second = self.columns
        lines = [f"== {self.title} ==", *self.notes,
                 f"{'measure':<48} {first:>14} {second:>12} {'ratio' if not self.change else 'change':>8}  target"]
        for row in self.rows:
            ratio = row.ratio
            if ratio is None:
                compared = "-"
            elif self.change:
                compared = f"{(ratio - 1) * 100:+.1f}%"
            else:
                compared = f"{ratio:.2f}x"
            verdict = {True: " (met)", False: " (MISSED)", None: ""}[row.met]
            lines.append(f"{row.measure:<48} {_num(row.first):>14} {_num(row.reckon):>12} {compared:>8}  "
                         f"{row.target}{verdict}".rstrip())
        return lines

    def as_json(self) -> dict[str, Any]:
        first, second = self.columns
        rows = [{"measure": r.measure, first: r.first, second: r.reckon,
                 ("change_pct" if self.change else "ratio"):
                     None if r.ratio is None else ((r.ratio - 1) * 100 if self.change else r.ratio),
                 "target": r.target, "met": r.met} for r in self.rows]
        return {"title": self.title, "notes": self.notes, "rows": rows}


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
