"""Request bodies: media type, size (chunked too), and strict JSON (nesting depth, duplicate members).

The common path is orjson plus one walk over the decoded containers. orjson cannot see duplicate
member names (the last one wins), so the walk counts object members and compares them with the
colons in the raw bytes: every member has one colon, and a colon inside a string only adds to the
count, so equal counts prove there is no duplicate. Only a body whose strings contain colons (or
that has a duplicate) is decoded a second time, by the standard library, to find the duplicate.
"""

from __future__ import annotations

import json
import re
from typing import Any

import falcon
import orjson

from pipeline.jobs import MAX_DEPTH

from .problems import Problem

#: ``application/json`` or a structured ``+json`` type (RFC 6839), parameters ignored.
_JSON_MEDIA_RE = re.compile(r"application/(?:[A-Za-z0-9!#$&^_.-]+\+)?json")


def read_json(req: falcon.Request, limit: int) -> Any:
    """The decoded body, or the problem that refuses it: 415, 413, 400 or 422, in that order."""
    media_type = (req.content_type or "").partition(";")[0].strip()
    if not _JSON_MEDIA_RE.fullmatch(media_type.lower()):
        raise Problem(415, "unsupported-media-type", "Unsupported media type",
                      "send the job as Content-Type: application/json")
    data = _read(req, limit)
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise Problem(400, "malformed-json", "Malformed JSON", "the request body is not valid JSON") from None
    members = _check_depth(body)
    if data.count(b":") != members:
        _refuse_duplicates(data)
    return body


def _read(req: falcon.Request, limit: int) -> bytes:
    """At most ``limit`` bytes of body. Without Content-Length (chunked), the server's input stream
    is read to its end when the server promises one (``wsgi.input_terminated``, as gunicorn does)."""
    if (req.content_length or 0) > limit:
        raise _too_large(limit)
    chunked = req.content_length is None and req.env.get("wsgi.input_terminated")
    data = (req.stream if chunked else req.bounded_stream).read(limit + 1)
    if len(data) > limit:
        raise _too_large(limit)
    return data


def _too_large(limit: int) -> Problem:
    return Problem(413, "payload-too-large", "Request body too large", f"the limit is {limit} bytes")


def _check_depth(body: Any) -> int:
    """Refuse a body nested deeper than MAX_DEPTH (422 naming the top-level member); return the
    number of object members in it."""
    if not isinstance(body, dict):
        depth, members = shape(body, MAX_DEPTH)
        if depth > MAX_DEPTH:
            raise _too_deep("body")
        return members
    members = len(body)
    for name, value in body.items():
        depth, inner = shape(value, MAX_DEPTH - 1)
        if depth > MAX_DEPTH - 1:
            raise _too_deep(name)
        members += inner
    return members


def _too_deep(field: str) -> Problem:
    return Problem(422, "invalid-job", "Invalid job request",
                   f"the request body must nest at most {MAX_DEPTH} levels", field=field)


def shape(value: Any, limit: int) -> tuple[int, int]:
    """(nesting depth of containers, object members) of a decoded JSON value, level by level
    without recursion; stops one level past ``limit``."""
    depth = members = 0
    level = [value] if isinstance(value, (dict, list)) else []
    while level and depth <= limit:
        depth += 1
        inner: list[Any] = []
        for node in level:
            if type(node) is dict:
                members += len(node)
                inner += [v for v in node.values() if type(v) in _CONTAINERS]
            else:
                inner += [v for v in node if type(v) in _CONTAINERS]
        level = inner
    return depth, members


_CONTAINERS = (dict, list)


class _Members(list[Any]):
    """An object's members in order, as the standard library decodes them (duplicates kept)."""


def _refuse_duplicates(data: bytes) -> None:
    """422 ``duplicate-member`` (I-JSON, RFC 7493) naming the top-level member that holds it."""
    try:
        top = json.loads(data, object_pairs_hook=_Members)  # depth is bounded by now: no deep recursion
    except (ValueError, RecursionError):  # not expected after orjson accepted it
        raise Problem(400, "malformed-json", "Malformed JSON", "the request body is not valid JSON") from None
    if not isinstance(top, _Members):
        field = "body" if _has_duplicate(top) else None
    else:
        field = _first_repeated([name for name, _ in top])
        field = field or next((name for name, value in top if _has_duplicate(value)), None)
    if field is not None:
        raise Problem(422, "duplicate-member", "Duplicate member name",
                      "a JSON object in the body names the same member twice", field=field)


def _first_repeated(names: list[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _has_duplicate(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, _Members):
            if len({name for name, _ in node}) != len(node):
                return True
            stack += [v for _, v in node]
        elif isinstance(node, list):
            stack += node
    return False
