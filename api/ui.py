"""The operators' status page: ``GET /ui`` (HTML) and ``GET /ui/status.json`` (the figures it polls).

Read-only, behind the operator token (``api/operator.py``: a Bearer header, or the cookie that
``/ui?token=<token>`` sets), never a tenant key.
"""

from __future__ import annotations

from pathlib import Path

import falcon

from api.operator import OperatorToken, csp, page, private
from pipeline.state import fairness, history, status
from pipeline.state.store import Store

PAGE = (Path(__file__).parent / "ui.html").read_bytes()
CSP = csp(PAGE)


class Page:
    """``GET /ui``: the HTML page (its figures come from ``/ui/status.json``)."""

    public = True

    def __init__(self, token: str) -> None:
        self.token = OperatorToken(token)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        private(resp)
        if self.token.sign_in(req, resp, "/ui"):
            return
        self.token.check(req)
        page(resp, PAGE, CSP)


class Status:
    """``GET /ui/status.json``: pipeline.state.status's snapshot, the recent problems and the queue history."""

    public = True

    def __init__(self, store: Store, token: str, caps: dict[str, int]) -> None:
        self.store, self.token, self.caps = store, OperatorToken(token), caps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        private(resp)
        self.token.check(req)
        figures = status.snapshot(self.store, self.caps)
        client, tenants = self.store.redis, self.store.tenants()
        resp.media = {
            "status": figures,
            "dead_letters": history.recent(client, tenants, "dead"),
            "needs_review": history.recent(client, tenants, "review"),
            "history": history.read(client, int(figures["at"])),
            "fairness": fairness.view(self.store),
        }
