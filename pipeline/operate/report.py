"""``reckon status`` as text: the fleet-wide figures on one screen."""

from __future__ import annotations

from typing import Any


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def render(snap: dict[str, Any]) -> str:
    """``reckon status`` on one screen: per class, money, sweeper, servers."""
    columns = ("depth", "oldest", "running", "retry_wait", "reconciling", "needs_review", "dead", "overdue", "paused")
    lines = [f"{'class':<12}" + "".join(f"{name:>13}" for name in columns)]
    for cls, row in snap["classes"].items():
        cells = [row["depth"], _age(row["oldest_age_s"]), row["running"], row["retry_wait"], row["reconciling"],
                 row["needs_review"], row["dead"], row["overdue"], "PAUSED" if row["paused"] else "-"]
        lines.append(f"{cls:<12}" + "".join(f"{cell!s:>13}" for cell in cells))
    money = snap["exposure"]
    budget = "full (unused)" if snap["retry_budget"] is None else f"{snap['retry_budget']:g} tokens"
    lines.append(f"exposure: reserved {money['reserved']}  uncertain {money['uncertain']}  "
                 f"(settled {money['settled']})   parked {snap['parked']}   retry budget {budget}")
    lines.append(f"sweeper: last pass {_age(snap['sweeper_age_s'])} ago, {snap['sweepers_alive']} passing")
    for name, server in snap["providers"].items():
        stops = ",".join(server["stopped"]) or "-"
        lines.append(f"server {name}: busy {server['busy']}/{server['cap']}  watched {server['watched']}  "
                     f"watcher {'up' if server['watcher_up'] else 'DOWN'}  stopped {stops}")
    return "\n".join(lines)


def render_fairness(view: dict[str, Any]) -> str:
    """The tenants with the most queued cost, and how the last minute's service met the fair shares."""
    lines = []
    for row in view["most_queued"]:
        more = "at least " if row["at_least"] else ""
        lines.append(f"tenant {row['tenant']}: queued {more}{row['jobs']} jobs, {more}{row['cost']} cost units")
    shares = "; ".join(f"{cls} {r['min']:g} to {r['max']:g}" for cls, r in view["shares"].items()) or "-"
    lines.append(f"cost served / weighted fair share (tenants waiting, last minute): {shares}")
    return "\n".join(lines)
