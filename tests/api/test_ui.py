"""The operators' status page (``GET /ui``): its token, and its figures in a real headless browser.

The browser test runs the API under gunicorn (ops/gunicorn.conf.py) and Debian's chromium, which
Playwright drives over the DevTools protocol on loopback; the test starts chromium itself and
stops it by its PID (process group), as it does gunicorn.
"""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from falcon import testing

from api.app import create_app
from api.operator import COOKIE
from pipeline.settings import Settings
from pipeline.state import history, keys, status
from pipeline.state.keys import ProviderKeys
from pipeline.state.store import Store
from tests.conftest import wait_until

from .conftest import auth, job_body

TOKEN = "op-token-7f3c9a"
CANARY = "CANARY-ui-4d1e9b"
P = "urn:reckon:problem:"
#: The one server of the web process's fleet (RECKON_PROVIDERS unset) and its cap.
SERVERS = {"comfyui": 2}


@pytest.fixture(autouse=True)
def operator_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autouse fixtures run first, so gunicorn (the ``web`` fixture) inherits the token."""
    monkeypatch.setenv("RECKON_OPERATOR_TOKEN", TOKEN)


def ui_client(settings: Settings, store: Store, token: str = TOKEN) -> testing.TestClient:
    app = create_app(dataclasses.replace(settings, operator_token=token), store=store,
                     publish=lambda job_id, priority: None)
    return testing.TestClient(app)


def test_only_the_operator_token_opens_the_page(settings, store, tenant) -> None:
    client, api_key = ui_client(settings, store), tenant()
    for path in ("/ui", "/ui/status.json"):
        for headers in ({}, auth(api_key), auth(TOKEN + "x"), {"Authorization": f"Basic {TOKEN}"}):
            resp = client.simulate_get(path, headers=headers)
            assert (resp.status_code, resp.headers["content-type"], resp.json["type"]) == (
                401, "application/problem+json", P + "unauthorized")
            assert resp.headers["www-authenticate"] == 'Bearer realm="reckon-operator"'
        assert client.simulate_get(path, headers=auth(TOKEN)).status_code == 200
    page = client.simulate_get("/ui", headers=auth(TOKEN))
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert "http" not in page.text.replace("http://www.w3.org/2000/svg", "")  # nothing loaded from elsewhere


def test_the_token_in_the_address_becomes_a_cookie_and_leaves_the_address(settings, store) -> None:
    client = ui_client(settings, store)
    wrong = client.simulate_get("/ui", params={"token": TOKEN[:-1], "every": "1"})
    assert (wrong.status_code, "set-cookie" in wrong.headers) == (401, False)
    resp = client.simulate_get("/ui", params={"token": TOKEN, "every": "1"})
    assert (resp.status_code, resp.headers["location"]) == (303, "/ui?every=1")
    cookie = resp.cookies[COOKIE]
    assert (cookie.http_only, cookie.same_site, cookie.path, cookie.secure) == (True, "Strict", "/ui", False)
    assert TOKEN not in cookie.value and len(cookie.value) == 64  # a digest of the token, not the token
    headers = {"Cookie": f"{COOKIE}={cookie.value}"}
    assert client.simulate_get("/ui/status.json", headers=headers).status_code == 200
    assert client.simulate_get("/ui", headers=headers).status_code == 200
    altered = cookie.value[:-1] + ("1" if cookie.value.endswith("0") else "0")
    assert client.simulate_get("/ui", headers={"Cookie": f"{COOKIE}={altered}"}).status_code == 401
    forwarded = client.simulate_get("/ui", params={"token": TOKEN}, headers={"X-Forwarded-Proto": "https"})
    assert (forwarded.headers["location"], forwarded.cookies[COOKIE].secure) == ("/ui", True)


def test_an_empty_operator_token_refuses_everyone(settings, store) -> None:
    client = ui_client(settings, store, token="")
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer"}, {"Cookie": f"{COOKIE}="}):
        assert client.simulate_get("/ui/status.json", headers=headers).status_code == 401
    assert client.simulate_get("/ui", params={"token": ""}).status_code == 401
    assert client.simulate_get("/ui", query_string="token=").status_code == 401


# -- the page in a browser -------------------------------------------------------------------------


def post_job(web, api_key: str, key: str, **body) -> str:
    headers = {**auth(api_key), "Idempotency-Key": key, "Content-Type": "application/json"}
    workflow = {"3": {"class_type": "KSampler", "inputs": {"seed": 5, "text": CANARY}}}
    code, _, raw = web.request("POST", "/v1/jobs", orjson.dumps(job_body(workflow=workflow, **body)), headers)
    assert code == 202, raw
    return orjson.loads(raw)["id"]


def set_up_state(web, store: Store, api_key: str) -> dict[str, str]:
    """interactive: 1 dead letter, 1 running, 1 needs_review (submitted: 10 units uncertain), 3 queued;
    batch: 2 queued (one past its 1 s deadline), paused; the server stopped; a sweeper 5 s ago."""
    ids = {name: post_job(web, api_key, name, priority="interactive") for name in ("dead", "run", "review", "q1")}
    ids |= {name: post_job(web, api_key, name, priority="batch") for name in ("b1",)}
    ids["late"] = post_job(web, api_key, "late", priority="batch", deadline_s=1)
    ids |= {name: post_job(web, api_key, name, priority="interactive") for name in ("q2", "q3")}
    claims = {}
    for name in ("dead", "run", "review"):  # the server has two slots: the dead letter's is given back first
        claims[name] = store.claim(ids[name], worker="w", lease_ms=60_000, operation_id=f"op-{name}",
                                   servers=SERVERS)
        assert claims[name] is not None, name
        if name == "dead":
            store.finish(claims["dead"], "failed", error_class="provider_rejected", reason="policy",
                         detail={"message": CANARY})
    store.mark_submit(claims["review"], epoch="e1", lease_ms=60_000)
    store.begin_reconcile(ids["review"], reason="unknown_outcome", claim=claims["review"])
    reconcile = store.claim_reconcile(ids["review"], worker="r", lease_ms=60_000)
    assert reconcile is not None
    store.send_to_review(reconcile.claim, expires_in_ms=7 * 24 * 3600 * 1000, reason="no_record")
    store.pause_class("batch")
    store.block_provider("comfyui", "dispatch_paused")
    now = store.server_ms()
    store.redis.hset(keys.SWEEPER, mapping={"at": now - 5_000, "at:h/1": now - 5_000})
    store.redis.hset(ProviderKeys("comfyui").budget, "tokens", 97.5)
    for minutes, depth in ((30, 7), (20, 9), (10, 4)):
        history.put(store.redis, {"interactive": {"depth": depth, "oldest_age_s": 60.0},
                                  "batch": {"depth": 1, "oldest_age_s": 2.0}}, now - minutes * 60_000)
    wait_until(lambda: status.snapshot(store, SERVERS)["classes"]["batch"]["overdue"] == 1, timeout=5)
    return ids


def texts(page, ids: list[str]) -> dict[str, str]:
    return {id_: page.locator(f"#{id_}").inner_text() for id_ in ids}


def test_the_page_shows_the_figures_and_follows_them_without_a_reload(web, chromium, store, tenant) -> None:
    from playwright.sync_api import expect, sync_playwright

    api_key = tenant("acme", 10**6)
    ids = set_up_state(web, store, api_key)
    for path, headers in (("/ui", {}), ("/ui", auth(api_key)), ("/ui/status.json", auth(api_key))):
        code, got, raw = web.request("GET", path, headers=headers)
        assert (code, got["content-type"], orjson.loads(raw)["type"]) == (401, "application/problem+json",
                                                                         P + "unauthorized")
    code, _, raw = web.request("GET", "/ui/status.json", headers=auth(TOKEN))
    assert code == 200 and CANARY.encode() not in raw
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(chromium.endpoint)
        context = browser.new_context()
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None)
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.goto(f"{web.url}/ui?token={TOKEN}&every=1")
        assert page.url == f"{web.url}/ui?every=1"  # the token left the address
        (cookie,) = context.cookies()
        assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
            COOKIE, True, "Strict", "/ui")
        assert TOKEN not in cookie["value"]
        expect(page.locator("#interactive-depth")).to_have_text("3", timeout=10_000)

        assert texts(page, [f"interactive-{f}" for f in ("depth", "running", "retry_wait", "reconciling",
                                                         "needs_review", "dead", "overdue", "paused")]) == {
            "interactive-depth": "3", "interactive-running": "1", "interactive-retry_wait": "0",
            "interactive-reconciling": "0", "interactive-needs_review": "1", "interactive-dead": "1",
            "interactive-overdue": "0", "interactive-paused": "no"}
        assert texts(page, ["batch-depth", "batch-running", "batch-overdue", "batch-paused",
                            "batch-service_estimate_s"]) == {
            "batch-depth": "2", "batch-running": "0", "batch-overdue": "1", "batch-paused": "paused",
            "batch-service_estimate_s": "\u2014"}
        # 6 unsettled jobs hold 30 each, the one under review 20 (its submitted output's 10 are uncertain)
        assert texts(page, ["exposure-reserved", "exposure-uncertain", "exposure-settled", "parked",
                            "retry-budget"]) == {
            "exposure-reserved": "200", "exposure-uncertain": "10", "exposure-settled": "0", "parked": "0",
            "retry-budget": "97.5"}
        oldest = float(page.locator("#interactive-oldest_age_s").get_attribute("data-value"))
        assert 0 < oldest < 60
        sweeper_age = float(page.locator("#sweeper-age").get_attribute("data-value"))
        assert 5 <= sweeper_age < 60
        assert page.locator("#sweepers-alive").inner_text() == "1"
        server = page.locator('#providers tr[data-provider="comfyui"] td')
        assert server.all_inner_texts() == ["comfyui", "1", "2", "dispatch_paused", "0", "down"]

        queued = page.locator('#most-queued tr[data-tenant="acme"] td')
        assert queued.all_inner_texts() == ["acme", "5", "50"]  # 3 interactive and 2 batch jobs: 1 output at 10
        dead = page.locator(f'#dead-letters tr[data-job="{ids["dead"]}"] td')
        assert dead.all_inner_texts()[:4] == [ids["dead"], "interactive", "provider_rejected", "policy"]
        assert page.locator("#dead-letters tbody tr").count() == 1
        link = page.locator(f'#dead-letters tr[data-job="{ids["dead"]}"] a')
        assert link.get_attribute("href") == f"/ui/jobs/{ids['dead']}"  # its job page
        review = page.locator(f'#needs-review tr[data-job="{ids["review"]}"] td')
        assert review.all_inner_texts()[:4] == [ids["review"], "interactive", "needs_review", "no_record"]
        # three samples of the last hour and the live figure
        line = page.locator('#chart-depth polyline[data-class="interactive"]')
        assert line.get_attribute("data-points") == "4"
        assert len(line.get_attribute("points").split()) == 4

        page.evaluate("window.sameDocument = true")
        polls = int(page.locator("#updated").get_attribute("data-polls"))
        ids |= {name: post_job(web, api_key, name, priority="interactive") for name in ("q4", "q5")}
        expect(page.locator("#interactive-depth")).to_have_text("5", timeout=10_000)
        assert page.evaluate("window.sameDocument") is True  # no reload: the page polled the new figures
        assert int(page.locator("#updated").get_attribute("data-polls")) > polls
        assert page.locator("#exposure-reserved").inner_text() == "260"

        assert CANARY not in page.content()
        assert problems == []  # no script error, no refused inline script or style (CSP)
        context.close()
        browser.close()
    code, _, raw = web.request("GET", "/ui", headers=auth(TOKEN))
    assert code == 200 and CANARY.encode() not in raw
