"""schemathesis hooks for tests/api/test_openapi.py, loaded by ``st run`` through SCHEMATHESIS_HOOKS.

Two rules of POST /v1/jobs depend on state, not on the request's shape, so the OpenAPI document
cannot state them as schema: an Idempotency-Key names one intent (the same key with another body
is 422 idempotency-key-reused), and ``supersedes`` must name an existing job of the tenant (422
otherwise). So each call gets a fresh key, and a well-formed ``supersedes`` names the job the test
admitted first (RECKON_TEST_JOB_ID). Malformed values are left alone: they must be refused.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

import schemathesis

KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
JOB_ID_RE = re.compile(r"[a-z0-9_]{1,40}\.[0-9a-f]{20}")


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if (case.method.upper(), case.path) != ("POST", "/v1/jobs"):
        return
    headers = case.headers or {}
    if isinstance(headers.get("Idempotency-Key"), str) and KEY_RE.fullmatch(headers["Idempotency-Key"]):
        headers["Idempotency-Key"] = uuid.uuid4().hex
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("supersedes"), str) and JOB_ID_RE.fullmatch(body["supersedes"]):
        body["supersedes"] = os.environ["RECKON_TEST_JOB_ID"]
