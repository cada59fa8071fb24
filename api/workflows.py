"""Saved workflows over HTTP: ``/v1/workflows`` (list those the tenant may use, save one of its own) and
``/v1/workflows/{ref}`` (one version: ``name@version``, or ``name`` for the latest). docs/api.md "Saved
workflows" says how a job names one. Neither a graph nor a parameter's value is ever logged.
"""

from __future__ import annotations

import falcon

from api.body import read_json
from api.problems import Problem
from pipeline.errors import InvalidParams, InvalidRequest
from pipeline.state.workflows import NameTaken, TooManyVersions, Workflows

_FIELDS = frozenset({"name", "workflow", "params"})


class WorkflowList:
    def __init__(self, workflows: Workflows, max_body_bytes: int) -> None:
        self.workflows, self.max_body_bytes = workflows, max_body_bytes

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"workflows": self.workflows.listing(req.context.tenant)}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, self.max_body_bytes)
        if not isinstance(body, dict):
            raise InvalidRequest("body", "a JSON object with name, workflow and params", problem="invalid-workflow")
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            raise InvalidRequest(unknown[0], "unknown field", problem="invalid-workflow")
        try:
            version, new = self.workflows.save(req.context.tenant, body.get("name"), body.get("workflow"),
                                          body.get("params", {}))
        except NameTaken as exc:
            raise Problem(409, "workflow-name-taken", "Workflow name taken", str(exc)) from None
        except TooManyVersions as exc:
            raise Problem(409, "too-many-versions", "Too many versions", str(exc)) from None
        resp.status = falcon.HTTP_201 if new else falcon.HTTP_200  # 200: the latest version holds it already
        resp.location = f"/v1/workflows/{version.ref}"
        resp.media = version.view(with_graph=True)


class WorkflowOne:
    def __init__(self, workflows: Workflows) -> None:
        self.workflows = workflows

    def on_get(self, req: falcon.Request, resp: falcon.Response, ref: str) -> None:
        try:
            version = self.workflows.resolve(req.context.tenant, ref)
        except InvalidRequest:
            version = None
        if version is None:  # another tenant's is not found either (never 403)
            raise Problem(404, "workflow-not-found", "Workflow not found")
        resp.media = version.view(with_graph=version.owner == req.context.tenant)


def _invalid_params(req: falcon.Request, resp: falcon.Response, exc: InvalidParams, params: dict) -> None:
    raise Problem(422, exc.problem, "Invalid parameters", exc.detail, field=exc.field,
                  params=[{"name": name[:64], "reason": reason} for name, reason in exc.bad[:64]])


def add_routes(app: falcon.App, workflows: Workflows, max_body_bytes: int) -> None:
    app.add_route("/v1/workflows", WorkflowList(workflows, max_body_bytes))
    app.add_route("/v1/workflows/{ref}", WorkflowOne(workflows))
    app.add_error_handler(InvalidParams, _invalid_params)
