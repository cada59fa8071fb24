"""Access to the operators' pages under ``/ui``: the operator token, its cookie, and their headers.

Every ``/ui`` resource is ``public`` for the tenant middleware and checks the operator token
(``RECKON_OPERATOR_TOKEN``) itself, never a tenant key. ``Authorization: Bearer <token>`` works
for all of them; a browser opens a page once with ``?token=<token>`` and gets a cookie
(HttpOnly, SameSite=Strict, Path=/ui) holding a digest of the token, then a redirect to the page
without the token in its address. An empty operator token refuses everyone. A page is one static
HTML file whose Content-Security-Policy runs only its own inline script and style (by hash).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from urllib.parse import urlencode

import falcon

from api.problems import Problem

COOKIE = "reckon_operator"


def csp(page: bytes) -> str:
    """Only the page's own inline script and style run; it fetches only from this origin."""
    def digests(tag: str) -> str:
        bodies = re.findall(rb"<%s>(.*?)</%s>" % (tag.encode(), tag.encode()), page, re.S)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b).digest()).decode()}'" for b in bodies)

    return (f"default-src 'none'; script-src {digests('script')}; style-src {digests('style')}; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


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

    def sign_in(self, req: falcon.Request, resp: falcon.Response, path: str) -> bool:
        """For ``?token=``: set the cookie and redirect (303) to ``path`` with the other parameters, and
        answer True; a wrong token is 401. False when the request has no ``token`` parameter."""
        sent = req.get_param("token")
        if sent is None:
            return False
        if not self.matches(sent):
            raise unauthorized()
        resp.set_cookie(COOKIE, self.cookie_value(), path="/ui", http_only=True, same_site="Strict",
                        secure=req.forwarded_scheme == "https")
        rest = [(name, value) for name, value in req.params.items() if name != "token"]
        resp.status = falcon.HTTP_303
        resp.location = path + (f"?{urlencode(rest, doseq=True)}" if rest else "")
        return True


def unauthorized() -> Problem:
    return Problem(401, "unauthorized", "Authentication required", "send Authorization: Bearer <operator token>",
                   headers={"WWW-Authenticate": 'Bearer realm="reckon-operator"'})


def private(resp: falcon.Response) -> None:
    """Nothing of an operator's answer is cached or sent on as a referrer."""
    resp.set_header("Cache-Control", "no-store")
    resp.set_header("Referrer-Policy", "no-referrer")


def page(resp: falcon.Response, html: bytes, policy: str) -> None:
    """Answer with a page's HTML under its Content-Security-Policy (``csp(html)``)."""
    resp.content_type = falcon.MEDIA_HTML
    resp.set_header("Content-Security-Policy", policy)
    resp.data = html
