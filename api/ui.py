"""The operators' status page: ``GET /ui`` (HTML) and ``GET /ui/status.json`` (the figures it polls).

Read-only, behind the operator token (``RECKON_OPERATOR_TOKEN``), never a tenant key: both resources
are ``public`` for the tenant middleware and check the token themselves. ``Authorization: Bearer
<token>`` works for both; a browser opens ``/ui?token=<token>`` once and gets a cookie
(HttpOnly, SameSite=Strict, Path=/ui) holding a digest of the token, then a redirect to the page
without the token in its address. An empty operator token refuses everyone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from pathlib import Path
from urllib.parse import urlencode

import falcon

from api.problems import Problem
from pipeline.state import fairness, history, status
from pipeline.state.store import Store

COOKIE = "reckon_operator"
PAGE = (Path(__file__).parent / "ui.html").read_bytes()


def _csp(page: bytes) -> str:
    """Only the page's own inline script and style run; it fetches only from this origin."""
    def digests(tag: str) -> str:
        bodies = re.findall(rb"<%s>(.*?)</%s>" % (tag.encode(), tag.encode()), page, re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b).digest()).decode()}'" for b in bodies)

    return (f"default-src 'none'; script-src {digests('script')}; style-src {digests('style')}; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


CSP = _csp(PAGE)


class OperatorToken:
    """Checks a request for the operator token: a Bearer header or the page's cookie."""

    def __init__(self, token: str) -> None:
        self.token = token.encode()

    def cookie_value(self) -> str:
        """A digest of the token, so the browser never stores the token itself."""
        return hmac.new(self.token, b"reckon operator page", hashlib.sha256).hexdigest()

    def matches(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest(candidate.encode(), self.token)

    def check(self, req: falcon.Request) -> None:
        """Nothing when the request carries the token (header or cookie); 401 otherwise."""
        scheme, _, sent = (req.get_header("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and self.matches(sent.strip()):
            return
        cookie = (req.get_cookie_values(COOKIE) or [""])[0]
        if self.token and hmac.compare_digest(cookie.encode(), self.cookie_value().encode()):
            return
        raise unauthorized()


def unauthorized() -> Problem:
    return Problem(401, "unauthorized", "Authentication required", "send Authorization: Bearer <operator token>",
                   headers={"WWW-Authenticate": 'Bearer realm="reckon-operator"'})


def _private(resp: falcon.Response) -> None:
    resp.set_header("Cache-Control", "no-store")
    resp.set_header("Referrer-Policy", "no-referrer")


class Page:
    """``GET /ui``: the HTML page (its figures come from ``/ui/status.json``)."""

    public = True

    def __init__(self, token: str) -> None:
        self.token = OperatorToken(token)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _private(resp)
        sent = req.get_param("token")
        if sent is not None:
            if not self.token.matches(sent):
                raise unauthorized()
            resp.set_cookie(COOKIE, self.token.cookie_value(), path="/ui", http_only=True, same_site="Strict",
                            secure=req.forwarded_scheme == "https")
            rest = [(name, value) for name, value in req.params.items() if name != "token"]
            resp.status = falcon.HTTP_303
            resp.location = "/ui" + (f"?{urlencode(rest, doseq=True)}" if rest else "")
            return
        self.token.check(req)
        resp.content_type = falcon.MEDIA_HTML
        resp.set_header("Content-Security-Policy", CSP)
        resp.data = PAGE


class Status:
    """``GET /ui/status.json``: pipeline.state.status's snapshot, the recent problems and the queue history."""

    public = True

    def __init__(self, store: Store, token: str, caps: dict[str, int]) -> None:
        self.store, self.token, self.caps = store, OperatorToken(token), caps

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _private(resp)
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
