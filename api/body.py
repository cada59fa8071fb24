"""Request bodies: media type, size (chunked too), and strict JSON (nesting depth, duplicate members).

orjson decodes (strictly: no NaN, no lone surrogates) but keeps the last of duplicate member names,
so duplicates are found by counting colons. A colon in JSON text is a member's separator or a
character inside a string, and orjson writes string colons literally; so if the body has the same
number of colons as orjson's encoding of what it decoded, no member was dropped. Only a body that
escapes a colon (``\\u003a``) or differs in that count is decoded again, by the standard library,
to find the duplicate. Measured costs are in docs/api.md ("The job request").
"""

from __future__ import annotations

import json
import re
from typing import Any

import falcon
import orjson

from api.problems import Problem
from pipeline.state.jobs import MAX_DEPTH

#: ``application/json`` or a structured ``+json`` type (RFC 6839), parameters ignored.
_JSON_MEDIA_RE = re.compile(r"application/(?:[A-Za-z0-9!#$&^_.-]+\+)?json")
_CONTAINERS = (dict, list)
#: A colon written as an escape decodes to a colon that the raw text does not show.
_ESCAPED_COLONS = (b"\\u003a", b"\\u003A")


def read_json(req: falcon.Request, limit: int, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded body, or the problem that refuses it: 415, 413, 400 or 422, in that order; ``max_depth``:
    how deep it may nest (a batch's items are two levels below its body: api/batches.py)."""
    check_media_type(req.content_type)
    return decode_json(_read(req, limit), max_depth)


def check_media_type(content_type: str | None) -> None:
    """415 unless the body is JSON (the streams process reads its body itself: api/streams/waits.py)."""
    media_type = (content_type or "").partition(";")[0].strip()
    if not _JSON_MEDIA_RE.fullmatch(media_type.lower()):
        raise Problem(415, "unsupported-media-type", "Unsupported media type",
                      "send the job as Content-Type: application/json")


def decode_json(data: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded body, or the problem that refuses it: 400, then 422."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _malformed() from None
    _check_depth(body, max_depth)
    if any(e in data for e in _ESCAPED_COLONS) or data.count(b":") != orjson.dumps(body).count(b":"):
        _refuse_duplicates(data)
    return body


def _read(req: falcon.Request, limit: int) -> bytes:
    """At most ``limit`` bytes of body. Without Content-Length (chunked), the server's input stream
    is read to its end when the server promises one (``wsgi.input_terminated``, as gunicorn does)."""
    if (req.content_length or 0) > limit:
        raise too_large(limit)
    chunked = req.content_length is None and req.env.get("wsgi.input_terminated")
    data = (req.stream if chunked else req.bounded_stream).read(limit + 1)
    if len(data) > limit:
        raise too_large(limit)
    return data


def too_large(limit: int) -> Problem:
    return Problem(413, "payload-too-large", "Request body too large", f"the limit is {limit} bytes")


def _check_depth(body: Any, limit: int) -> None:
    """Refuse a body nested deeper than ``limit``: 422 naming the top-level member that is."""
    if not isinstance(body, dict):
        if depth(body, limit) > limit:
            raise _too_deep("body", limit)
        return
    for name, value in body.items():
        if depth(value, limit - 1) > limit - 1:
            raise _too_deep(name, limit)


def _too_deep(field: str, limit: int = MAX_DEPTH) -> Problem:
    return Problem(422, "invalid-job", "Invalid job request",
                   f"the request body must nest at most {limit} levels", field=field)


def depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value (a scalar is 0), level by level without recursion;
    stops counting one level past ``limit``."""
    level = [value] if type(value) in _CONTAINERS else []
    levels = 0
    while level and levels <= limit:
        levels += 1
        level = [v for node in level for v in (node.values() if type(node) is dict else node)
                 if type(v) in _CONTAINERS]
    return levels


def _malformed() -> Problem:
    return Problem(400, "malformed-json", "Malformed JSON", "the request body is not valid JSON")


class _Members(list[Any]):
    """An object's members in order, as the standard library decodes them (duplicates kept)."""


def _refuse_duplicates(data: bytes) -> None:
    """422 ``duplicate-member`` (I-JSON, RFC 7493) naming the top-level member that holds one."""
    try:
        json.loads(data, object_pairs_hook=_unique)  # depth is bounded by now: no deep recursion
        return
    except _Duplicate:
        pass
    except RecursionError:  # a dropped duplicate nested deeper than the limit (orjson kept the other)
        raise _too_deep("body") from None
    except ValueError:  # not expected after orjson accepted it
        raise _malformed() from None
    top = json.loads(data, object_pairs_hook=_Members)  # the error path only: find where
    if isinstance(top, _Members):
        field = _first_repeated([name for name, _ in top])
        field = field or next((name for name, value in top if _has_duplicate(value)), "body")
    else:
        field = "body"
    raise Problem(422, "duplicate-member", "Duplicate member name",
                  "a JSON object in the body names the same member twice", field=field)


class _Duplicate(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _Duplicate
    return members


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
