"""``GET /v1/usage/records``: the tenant's own bookings, newest first, paged (pipeline/state/records.py)."""

from __future__ import annotations

from datetime import datetime

import falcon

from api.problems import Problem
from pipeline.state import records
from pipeline.state.jobs import iso
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store


def moment(req: falcon.Request, name: str) -> int | None:
    """An RFC 3339 time with its offset (``2026-12-06T10:00:00Z``) as ms (before 1970: 0); None if absent;
    400 for anything else."""
    raw = req.get_param(name)
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(raw.upper())
        if when.tzinfo is None:
            raise ValueError
    except ValueError:
        raise Problem(400, "invalid-parameter", "Invalid query parameter",
                      f"{name} must be an RFC 3339 time with its offset, like 2026-12-06T10:00:00Z", field=name) from None
    return max(0, int(when.timestamp() * 1000))


def parse_limit(req: falcon.Request) -> int:
    raw = req.get_param("limit")
    if raw is None:
        return records.DEFAULT_PAGE
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= records.MAX_PAGE):
        raise Problem(400, "invalid-parameter", "Invalid query parameter", f"limit must be 1..{records.MAX_PAGE}",
                      field="limit")
    return int(raw)


class UsageRecords:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        start = moment(req, "from") or 0
        end = moment(req, "to")
        end = self.store.server_ms(TenantKeys(req.context.tenant).shard) if end is None else end
        limit, raw = parse_limit(req), req.get_param("cursor")
        try:
            cursor = None if raw is None else records.decode_cursor(raw)
        except records.BadCursor as exc:
            raise Problem(400, "invalid-parameter", "Invalid query parameter", str(exc), field="cursor") from None
        rows, after = records.page(self.store.redis, req.context.tenant, start_ms=start, end_ms=end,
                                   cursor=cursor, limit=limit)
        resp.media = {"records": [{**row, "at": iso(row["at"])} for row in rows],
                      "next_cursor": None if after is None else records.encode_cursor(*after)}

