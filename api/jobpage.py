"""The operators' job page: ``GET /ui/jobs`` and ``GET /ui/jobs/{job_id}`` (HTML), ``GET
/ui/jobs/{job_id}.json`` (one job) and ``GET /ui/jobs.json`` (the newest dead letters and reviews).

Read-only, behind the operator token (``api/operator.py``), under ``/ui`` where the page's cookie
is sent. One job is ``pipeline.state.lookup.job`` (never the workflow, an output's sha256 or the
error's detail) with the ``reckon`` commands an operator would run next (``pipeline.operate.advice``),
as text: the page runs none.
"""

from __future__ import annotations

from pathlib import Path

import falcon

from api.operator import OperatorToken, csp, page, private
from api.problems import Problem
from pipeline.operate.advice import next_commands
from pipeline.state import history, lookup
from pipeline.state.ids import JOB_ID_RE
from pipeline.state.store import Store

PAGE = (Path(__file__).parent / "jobpage.html").read_bytes()
CSP = csp(PAGE)


class Page:
    """``GET /ui/jobs`` (a look-up and the lists) and ``/ui/jobs/{job_id}`` (that job): one static page
    that reads the JSON resources below. ``?token=`` signs in and comes back here without it."""

    public = True

    def __init__(self, token: str) -> None:
        self.token = OperatorToken(token)

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str | None = None) -> None:
        private(resp)
        here = f"/ui/jobs/{job_id}" if job_id is not None and JOB_ID_RE.fullmatch(job_id) else "/ui/jobs"
        if self.token.sign_in(req, resp, here):
            return
        self.token.check(req)
        if job_id is not None and job_id.endswith(".json"):  # the JSON route's, with an id its pattern refused
            raise invalid_id()
        page(resp, PAGE, CSP)


class Job:
    """``GET /ui/jobs/{job_id}.json``: the job as an operator sees it and the commands to run next."""

    public = True

    def __init__(self, store: Store, token: str) -> None:
        self.store, self.token = store, OperatorToken(token)

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        private(resp)
        self.token.check(req)
        if not JOB_ID_RE.fullmatch(job_id):
            raise invalid_id()
        job = lookup.job(self.store.redis, job_id)
        if job is None:
            raise Problem(404, "job-not-found", "Job not found")
        resp.media = {"job": job, "commands": next_commands(job)}


def invalid_id() -> Problem:
    return Problem(400, "invalid-parameter", "Invalid job id", "a job id is <tenant>.<20 lower-case hex digits>",
                   field="job_id")


class Recent:
    """``GET /ui/jobs.json``: the newest dead letters and needs_review jobs of every tenant (as on ``/ui``)."""

    public = True

    def __init__(self, store: Store, token: str) -> None:
        self.store, self.token = store, OperatorToken(token)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        private(resp)
        self.token.check(req)
        client, tenants = self.store.redis, self.store.tenants()
        resp.media = {"dead_letters": history.recent(client, tenants, "dead"),
                      "needs_review": history.recent(client, tenants, "review")}
