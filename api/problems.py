"""RFC 9457 problem details: one stable ``type`` per problem, served as application/problem+json."""

from __future__ import annotations

from typing import Any

import falcon
import orjson

PROBLEM_BASE = "urn:reckon:problem:"
CONTENT_TYPE = "application/problem+json"

#: Types for errors Falcon raises itself (routing, methods, media).
_BY_STATUS = {
    400: "bad-request",
    401: "unauthorized",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
    415: "unsupported-media-type",
}


class Problem(falcon.HTTPError):
    """An HTTP error with a stable problem type and optional extension members."""

    def __init__(self, status: int, problem: str, title: str, detail: str | None = None,
                 headers: dict[str, str] | None = None, **extensions: Any) -> None:
        super().__init__(status, title=title, description=detail, headers=headers)
        self.problem = problem
        self.extensions = extensions


def problem_body(exc: falcon.HTTPError) -> dict[str, Any]:
    status = exc.status_code
    slug = getattr(exc, "problem", None) or _BY_STATUS.get(status, f"http-{status}")
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug, "title": exc.title, "status": status}
    if exc.description:
        body["detail"] = exc.description
    body.update(getattr(exc, "extensions", {}))
    return body


def serialize(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    resp.content_type = CONTENT_TYPE
    resp.data = orjson.dumps(problem_body(exc))
