"""The commands the job page suggests (pipeline/operate/advice.py): each state's, exactly, and every
one of them read by the ``reckon`` parser as the command it names, for that job."""

from __future__ import annotations

import itertools
import shlex
from typing import Any

import pytest

from pipeline.operate import cli, commands
from pipeline.operate.advice import NOT_REPLAYED, next_commands
from pipeline.state.jobs import State

JOB = "acme_2.0123456789abcdef0123"


def job(state: str, *, error_class: str | None = None, stored: int = 0, requested: int = 1,
        parked: bool = False) -> dict[str, Any]:
    return {"id": JOB, "tenant": "acme_2", "state": state, "parked": parked, "outputs_requested": requested,
            "outputs": [{"index": n} for n in range(stored)],
            "error": {"class": error_class, "reason": "r"} if error_class else None}


def lines(view: dict[str, Any]) -> list[str]:
    return [c["command"] for c in next_commands(view)]


def test_each_state_gets_its_commands() -> None:
    show = f"reckon job show {JOB}"
    assert lines(job("queued")) == ["reckon status", show]
    assert lines(job("queued", parked=True)) == ["reckon provider status", "reckon status", show]
    assert lines(job("running")) == [f"reckon job events {JOB}", "reckon provider status", show]
    assert lines(job("retry_wait", error_class="transient")) == ["reckon provider status", show]
    assert lines(job("reconciling")) == ["reckon provider status", "reckon jobs --state reconciling --tenant acme_2",
                                         show]
    assert lines(job("needs_review", stored=1)) == [f"reckon review resolve {JOB} --completed",
                                                    f"reckon review resolve {JOB} --failed",
                                                    f"reckon review resolve {JOB} --retry", show]
    # --completed is refused while an output is missing: not suggested
    assert lines(job("needs_review", stored=1, requested=2)) == [f"reckon review resolve {JOB} --failed",
                                                                 f"reckon review resolve {JOB} --retry", show]
    assert lines(job("failed", error_class="transient")) == [f"reckon dlq replay {JOB}", "reckon tenant show acme_2",
                                                             show]
    for error_class in sorted(NOT_REPLAYED):  # the client's to fix: never a replay
        advice = next_commands(job("failed", error_class=error_class))
        assert [c["command"] for c in advice] == [show] and "do not replay" in advice[0]["why"]
    assert lines(job("completed")) == lines(job("cancelled")) == [show]
    assert all(c["why"] for c in next_commands(job("needs_review", stored=1)))


#: The function of ``pipeline.operate.commands`` each suggested command runs.
RUNS = {"reckon status": commands.status, "reckon provider status": commands.provider_status,
        "reckon job show": commands.job_show, "reckon job events": commands.job_events,
        "reckon jobs": commands.jobs_list, "reckon review resolve": commands.review_resolve,
        "reckon dlq replay": commands.dlq_replay, "reckon tenant show": commands.tenant_show}


def every_suggestion() -> list[str]:
    views = [job(state.value, error_class=error_class, stored=stored, parked=parked)
             for state, error_class, stored, parked in itertools.product(
                 State, (None, "transient", *sorted(NOT_REPLAYED)), (0, 1), (False, True))]
    return sorted({c["command"] for view in views for c in next_commands(view)})


@pytest.mark.parametrize("command", every_suggestion())
def test_every_suggested_command_parses_as_the_command_it_names(command: str) -> None:
    words = shlex.split(command)
    assert words[0] == "reckon" and shlex.join(words) == command  # nothing the shell would read otherwise
    args = cli.parser().parse_args(words[1:])
    (named,) = [name for name in RUNS if command == name or command.startswith(name + " ")]
    assert args.run is RUNS[named]
    if "id" in vars(args):
        assert args.id == JOB
    if command.startswith("reckon review resolve"):
        assert args.decision == command.rsplit("--", 1)[1]
    if command.startswith("reckon jobs"):
        assert (args.state, args.tenant) == ("reconciling", "acme_2")
    if command.startswith("reckon tenant show"):
        assert args.name == "acme_2"


def test_the_suggestions_cover_every_command_they_may_name() -> None:
    named = {name for command in every_suggestion() for name in RUNS if command == name or
             command.startswith(name + " ")}
    assert named == set(RUNS)
