"""The ``reckon`` commands an operator would run next for one job, by its state.

The job page (``GET /ui/jobs/<id>``) shows them as text to copy; it runs none of them. Each is
written as the parser of ``pipeline/operate/cli.py`` reads it (a test parses every one), with why
one would run it, after ops/RUNBOOK.md ("Needs review", "Dead letters").
"""

from __future__ import annotations

from typing import Any, Mapping

#: Error classes of a dead letter that fails the same way again (the provider refused the input,
#: refused it on policy, or ran it and it failed): the client's to fix, never replayed.
NOT_REPLAYED = frozenset({"invalid_input", "policy_rejected", "execution_failed"})


def next_commands(job: Mapping[str, Any]) -> list[dict[str, str]]:
    """[{command, why}] for ``job`` as ``pipeline.state.lookup.job`` reads it, most useful first."""
    job_id, tenant, state = job["id"], job["tenant"], job["state"]
    error_class = (job.get("error") or {}).get("class")
    found: list[tuple[str, str]] = []
    if state == "queued":
        if job.get("parked"):
            found.append(("reckon provider status",
                          "parked: no server that can run it has a free slot; each server's load, cap and stops"))
        found.append(("reckon status", "whether its class is paused, and how deep the queue ahead of it is"))
    elif state == "running":
        found.append((f"reckon job events {job_id}", "its state changes and progress so far"))
        found.append(("reckon provider status", "its server's load, cap and stops"))
    elif state == "retry_wait":
        found.append(("reckon provider status", "the retry budget and the servers' stops, which hold its next attempt"))
    elif state == "reconciling":
        found.append(("reckon provider status",
                      "whether its server is unreachable: reconciliation asks that same server, never another"))
        found.append((f"reckon jobs --state reconciling --tenant {tenant}",
                      "the tenant's other jobs waiting for an answer"))
    elif state == "needs_review":
        found += _review(job_id, stored=len(job.get("outputs", ())), requested=int(job.get("outputs_requested", 0)))
    elif state == "failed" and error_class not in NOT_REPLAYED:
        found.append((f"reckon dlq replay {job_id}", "once the cause is gone (the provider healthy again): the same "
                                                     "job runs again, its ceiling reserved again"))
        found.append((f"reckon tenant show {tenant}",
                      "the tenant's available units: a replay it cannot afford is refused"))
    if state == "failed" and error_class in NOT_REPLAYED:
        found.append((f"reckon job show {job_id}", f"{error_class}: the error's detail names what was refused; the "
                                                   "client's to fix, do not replay"))
    else:
        found.append((f"reckon job show {job_id}", "the whole record as the CLI prints it, with what this page "
                                                   "leaves out (the error's detail, each output's sha256)"))
    return [{"command": command, "why": why} for command, why in found]


def _review(job_id: str, *, stored: int, requested: int) -> list[tuple[str, str]]:
    """The three decisions of a review; ``--completed`` only once every output is stored (else refused)."""
    first = "look its attempt's operation id up in the provider's own records or billing, then: "
    found = []
    if stored >= requested:
        found.append((f"reckon review resolve {job_id} --completed", first + "it ran and every output is stored"))
        first = ""
    found.append((f"reckon review resolve {job_id} --failed", first + "it ran (or you cannot tell) and nothing "
                  "usable came back: the uncertain cost is settled as charged"))
    found.append((f"reckon review resolve {job_id} --retry", "it never ran: the uncertain cost returns to the "
                  "reservation and one more attempt is allowed"))
    return found
