"""What a tenant name and a job id look like: a job id embeds its tenant (``<tenant>.<hex>``), so a
worker that has only a job id finds every key (keys.py)."""

from __future__ import annotations

import re
import secrets

#: Use with ``fullmatch`` (``$`` would also accept a trailing newline).
TENANT_RE = re.compile(r"[a-z0-9_]{1,40}")
JOB_ID_RE = re.compile(r"([a-z0-9_]{1,40})\.([0-9a-f]{20})")


def new_job_id(tenant: str) -> str:
    return f"{tenant}.{secrets.token_hex(10)}"


def tenant_of(job_id: str) -> str:
    """The tenant a job id belongs to; ValueError for anything that is not a job id."""
    match = JOB_ID_RE.fullmatch(job_id)
    if not match:
        raise ValueError("not a job id")
    return match.group(1)
