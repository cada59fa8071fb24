"""A tenant's webhook endpoints over HTTP: ``/v1/webhooks`` (add, list), ``/v1/webhooks/{webhook_id}`` (read,
remove), ``/rotate`` (a new secret) and ``/deliveries`` (those whose retries ran out). A secret is in the
answer that made it and nowhere else. docs/webhooks.md says what is sent and how.
"""

from __future__ import annotations

import falcon

from api.body import read_json
from api.problems import Problem
from pipeline.errors import InvalidRequest
from pipeline.settings import Settings
from pipeline.webhooks.deliveries import Deliveries
from pipeline.webhooks.endpoints import EndpointNotFound, Endpoints, TooManyEndpoints, check, view

#: Bytes of a request body, at most.
BODY_LIMIT = 8 * 1024
_FIELDS = frozenset({"url", "types"})


def _not_found() -> Problem:
    return Problem(404, "webhook-not-found", "Webhook endpoint not found")


class Webhooks:
    def __init__(self, endpoints: Endpoints, settings: Settings) -> None:
        self.endpoints, self.settings = endpoints, settings

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"webhooks": [view(e) for e in self.endpoints.all(req.context.tenant)]}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_json(req, BODY_LIMIT)
        if not isinstance(body, dict):
            raise InvalidRequest("", "a JSON object with url and types", problem="invalid-webhook")
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            raise InvalidRequest(unknown[0], "unknown field", problem="invalid-webhook")
        url, types = check(body.get("url"), body.get("types"), allow_private=self.settings.webhook_allow_private)
        try:
            endpoint, secret = self.endpoints.add(req.context.tenant, url, types)
        except TooManyEndpoints as exc:
            raise Problem(409, "too-many-webhooks", "Too many webhook endpoints", str(exc)) from None
        resp.status = falcon.HTTP_201
        resp.location = f"/v1/webhooks/{endpoint['id']}"
        resp.media = {**view(endpoint), "secret": secret}


class Webhook:
    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints

    def on_get(self, req: falcon.Request, resp: falcon.Response, webhook_id: str) -> None:
        try:
            resp.media = view(self.endpoints.get(req.context.tenant, webhook_id))
        except EndpointNotFound:
            raise _not_found() from None

    def on_delete(self, req: falcon.Request, resp: falcon.Response, webhook_id: str) -> None:
        try:
            self.endpoints.remove(req.context.tenant, webhook_id)
        except EndpointNotFound:
            raise _not_found() from None
        resp.status = falcon.HTTP_204


class Rotate:
    def __init__(self, endpoints: Endpoints, settings: Settings) -> None:
        self.endpoints, self.settings = endpoints, settings

    def on_post(self, req: falcon.Request, resp: falcon.Response, webhook_id: str) -> None:
        try:
            endpoint, secret = self.endpoints.rotate(req.context.tenant, webhook_id,
                                                     self.settings.webhook_secret_overlap_seconds)
        except EndpointNotFound:
            raise _not_found() from None
        resp.media = {**view(endpoint), "secret": secret}


class Exhausted:
    def __init__(self, endpoints: Endpoints, deliveries: Deliveries) -> None:
        self.endpoints, self.deliveries = endpoints, deliveries

    def on_get(self, req: falcon.Request, resp: falcon.Response, webhook_id: str) -> None:
        try:
            self.endpoints.get(req.context.tenant, webhook_id)
        except EndpointNotFound:
            raise _not_found() from None
        resp.media = {"deliveries": self.deliveries.exhausted(req.context.tenant, webhook_id)}


def add_routes(app: falcon.App, endpoints: Endpoints, deliveries: Deliveries, settings: Settings) -> None:
    app.add_route("/v1/webhooks", Webhooks(endpoints, settings))
    app.add_route("/v1/webhooks/{webhook_id}", Webhook(endpoints))
    app.add_route("/v1/webhooks/{webhook_id}/rotate", Rotate(endpoints, settings))
    app.add_route("/v1/webhooks/{webhook_id}/deliveries", Exhausted(endpoints, deliveries))
