"""The HTTP baseline of ops/bench/bench.py: reckon's app plus one trivial authenticated route.

gunicorn serves ``ops.bench.bench_app:create_app()`` with ops/gunicorn.conf.py, as it serves reckon.
``/bench/ping`` passes reckon's Authenticate middleware (one Redis lookup of the key, as every
authenticated request does) and answers 200 ``{"tenant": ...}``; it reads nothing else. So the
bench compares ``POST /v1/jobs`` with the cheapest authenticated request on the same server.
"""

from __future__ import annotations

import falcon

from api.app import create_app as reckon_app


class Ping:
    """200 with the caller's tenant, for GET and for POST (whose body it leaves unread)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"tenant": req.context.tenant}

    on_post = on_get


def create_app() -> falcon.App:
    app = reckon_app()
    app.add_route("/bench/ping", Ping())
    return app
