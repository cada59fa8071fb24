"""The operators' job page (``GET /ui/jobs/<id>``): its token, its JSON, and the page in a real browser.

The JSON carries exactly the fields pipeline/state/lookup.py names and the commands of
pipeline/operate/advice.py; a canary in the workflow, in the error's detail and in an output's
sha256 never reaches it. The browser test runs the API under gunicorn and Debian's headless
chromium, as tests/api/test_ui.py does.
"""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from falcon import testing

from api.app import create_app
from api.operator import COOKIE
from pipeline.settings import Settings
from pipeline.state import progress
from pipeline.state.jobs import iso
from pipeline.state.store import Store

from .conftest import auth, job_body

TOKEN = "op-token-2c81d4"
CANARY = "CANARY-jobpage-9e04aa"
#: An output's sha256 (the name of its blob), distinctive so that a test sees it is never shown.
SHA = "5ca1ab1e" * 8
P = "urn:reckon:problem:"
WEEK_MS = 7 * 24 * 3600 * 1000


@pytest.fixture(autouse=True)
def operator_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autouse fixtures run first, so gunicorn (the ``web`` fixture) inherits the token."""
    monkeypatch.setenv("RECKON_OPERATOR_TOKEN", TOKEN)


def page_client(settings: Settings, store: Store) -> testing.TestClient:
    app = create_app(dataclasses.replace(settings, operator_token=TOKEN), store=store,
                     publish=lambda job_id, priority: None)
    return testing.TestClient(app)


def submit(client: testing.TestClient, api_key: str, key: str, **body) -> str:
    """A job whose workflow and Idempotency-Key hold the canary."""
    workflow = {"9": {"class_type": "KSampler", "inputs": {"seed": 5, "text": CANARY}}}
    resp = client.simulate_post("/v1/jobs", json=job_body(workflow=workflow, **body),
                                headers={**auth(api_key), "Idempotency-Key": f"{key}-{CANARY}"})
    assert resp.status_code == 202, resp.text
    return resp.json["id"]


def to_review(store: Store, job_id: str, server: str, t: int) -> None:
    """Claimed at t+1 s, one progress point, submitted, its output stored, its outcome lost: reconciled,
    then sent to review at t+5 s (a review expires in a week)."""
    held = store.claim(job_id, worker="w-1", lease_ms=60_000, operation_id="op-review", servers={server: 2},
                       now_ms=t + 1_000)
    assert held is not None
    assert progress.record(store.scripts, job_id, 1, "op-review", "9", 7, 20, now_ms=t + 1_500)
    store.mark_submit(held, epoch="e1", lease_ms=60_000, now_ms=t + 2_000)
    store.store_output(held, 0, {"sha256": SHA, "bytes": 2048, "content_type": "image/png"}, now_ms=t + 2_500)
    store.begin_reconcile(job_id, reason="unknown_outcome", claim=held, now_ms=t + 3_000)
    reconcile = store.claim_reconcile(job_id, worker="r-1", lease_ms=60_000, now_ms=t + 4_000)
    assert reconcile is not None
    store.send_to_review(reconcile.claim, expires_in_ms=WEEK_MS, reason="no_record", now_ms=t + 5_000)


def dead_letter(store: Store, job_id: str, server: str) -> None:
    held = store.claim(job_id, worker="w-2", lease_ms=60_000, operation_id="op-dead", servers={server: 2})
    assert held is not None
    store.finish(held, "failed", error_class="provider_rejected", reason="policy", detail={"message": CANARY})


def paths(job_id: str) -> list[str]:
    return ["/ui/jobs", f"/ui/jobs/{job_id}", f"/ui/jobs/{job_id}.json", "/ui/jobs.json"]


def test_only_the_operator_token_opens_the_page_and_its_json(settings, store, tenant) -> None:
    client, api_key = page_client(settings, store), tenant()
    job_id = submit(client, api_key, "one")
    for path in paths(job_id):
        for headers in ({}, auth(api_key), auth(TOKEN + "x"), {"Authorization": f"Basic {TOKEN}"},
                        {"Cookie": f"{COOKIE}={TOKEN}"}):
            resp = client.simulate_get(path, headers=headers)
            assert (resp.status_code, resp.headers["content-type"], resp.json["type"]) == (
                401, "application/problem+json", P + "unauthorized"), (path, headers)
        resp = client.simulate_get(path, headers=auth(TOKEN))
        assert (resp.status_code, resp.headers["cache-control"], resp.headers["referrer-policy"]) == (
            200, "no-store", "no-referrer")
    page = client.simulate_get(f"/ui/jobs/{job_id}", headers=auth(TOKEN))
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert "form-action 'none'" in page.headers["content-security-policy"]
    assert "http" not in page.text  # nothing loaded from elsewhere
    assert page.text == client.simulate_get("/ui/jobs", headers=auth(TOKEN)).text  # one static page
    assert job_id not in page.text and CANARY not in page.text


def test_the_cookie_of_the_status_page_opens_the_job_page_and_a_token_here_comes_back_here(settings, store,
                                                                                          tenant) -> None:
    client, api_key = page_client(settings, store), tenant()
    job_id = submit(client, api_key, "one")
    cookie = client.simulate_get("/ui", params={"token": TOKEN}).cookies[COOKIE]
    for path in paths(job_id):
        assert client.simulate_get(path, headers={"Cookie": f"{COOKIE}={cookie.value}"}).status_code == 200
    resp = client.simulate_get(f"/ui/jobs/{job_id}", params={"token": TOKEN, "every": "2"})
    assert (resp.status_code, resp.headers["location"]) == (303, f"/ui/jobs/{job_id}?every=2")
    signed_in = resp.cookies[COOKIE]
    assert (signed_in.value, signed_in.path, signed_in.http_only, signed_in.same_site) == (
        cookie.value, "/ui", True, "Strict")
    assert client.simulate_get("/ui/jobs", params={"token": TOKEN}).headers["location"] == "/ui/jobs"
    # an address that is no job id is never echoed into the redirect
    assert client.simulate_get("/ui/jobs/x%0d%0aSet-Cookie:a=b", params={"token": TOKEN}).headers["location"] == \
        "/ui/jobs"
    wrong = client.simulate_get(f"/ui/jobs/{job_id}", params={"token": TOKEN[:-1]})
    assert (wrong.status_code, "set-cookie" in wrong.headers) == (401, False)


@pytest.mark.parametrize("bad", ["nope", "acme.0123", "ACME.0123456789abcdef0123", "acme.0123456789ABCDEF0123",
                                 "acme.0123456789abcdef01234", "acme-x.0123456789abcdef0123", "a" * 5000,
                                 "acme.0123456789abcdef0123%0a", "%00", "acme..json", "%E2%82%AC.0123456789abcdef0123"])
def test_a_bad_job_id_is_a_400_problem(settings, store, bad) -> None:
    resp = page_client(settings, store).simulate_get(f"/ui/jobs/{bad}.json", headers=auth(TOKEN))
    assert (resp.status_code, resp.headers["content-type"], resp.json["type"], resp.json["field"]) == (
        400, "application/problem+json", P + "invalid-parameter", "job_id")


def test_an_unknown_job_is_a_404_problem(settings, store) -> None:
    client = page_client(settings, store)
    for job_id in ("acme.0123456789abcdef0123", "nobody.0123456789abcdef0123"):
        resp = client.simulate_get(f"/ui/jobs/{job_id}.json", headers=auth(TOKEN))
        assert (resp.status_code, resp.headers["content-type"], resp.json) == (
            404, "application/problem+json", {"type": P + "job-not-found", "title": "Job not found", "status": 404})


def test_a_job_under_review_shows_its_record_attempts_timeline_and_commands(settings, store, tenant) -> None:
    client, api_key = page_client(settings, store), tenant()
    job_id = submit(client, api_key, "review", outputs=2)
    t = int(store.job(job_id)["created_at"])
    to_review(store, job_id, "sim", t)
    resp = client.simulate_get(f"/ui/jobs/{job_id}.json", headers=auth(TOKEN))
    assert resp.status_code == 200
    assert resp.json == {"job": {
        "id": job_id, "tenant": "acme", "state": "needs_review", "kind": "image", "priority": "interactive",
        "outputs_requested": 2, "attempt_count": 1, "attempts_listed": 1, "attempts_allowed": 3,
        "cancel_requested": False, "obsolete": False, "external_effect": None, "supersedes": None,
        "deadline": iso(t + 3_600_000), "created_at": iso(t), "updated_at": iso(t + 5_000), "settled_at": None,
        "error": {"class": "needs_review", "reason": "no_record"},
        "next": {"what": "review_expires", "at": iso(t + 5_000 + WEEK_MS)}, "parked": False,
        # 3 attempts of 2 outputs at 10; the submitted attempt's whole run is uncertain (docs/costs.md)
        "cost": {"price": 10, "per_attempt": 20, "ceiling": 60, "reserved": 40, "charged": 0, "uncertain": 20,
                 "settled": 0},
        "outputs": [{"index": 0, "bytes": 2048, "content_type": "image/png"}],
        "attempts": [{"number": 1, "state": "unknown", "server": "sim", "provider": "comfyui", "worker": "w-1",
                      "generation": 1, "price": 10, "operation_id": "op-review", "started_at": iso(t + 1_000),
                      "submitted_at": iso(t + 2_000), "ended_at": iso(t + 3_000), "error_class": "unknown_outcome"}],
        "events": [
            {"seq": 1, "type": "state", "at": iso(t), "from": None, "to": "queued", "reason": "admitted"},
            {"seq": 2, "type": "state", "at": iso(t + 1_000), "from": "queued", "to": "running", "reason": "claimed"},
            {"seq": 3, "type": "progress", "at": iso(t + 1_500), "attempt": 1, "node": "9", "value": 7, "max": 20},
            {"seq": 4, "type": "state", "at": iso(t + 3_000), "from": "running", "to": "reconciling",
             "reason": "unknown_outcome"},
            {"seq": 5, "type": "state", "at": iso(t + 5_000), "from": "reconciling", "to": "needs_review",
             "reason": "no_record"},
        ]},
        "commands": [  # one output of two stored: --completed would be refused, so it is not suggested
            {"command": f"reckon review resolve {job_id} --failed",
             "why": "look its attempt's operation id up in the provider's own records or billing, then: it ran (or "
                    "you cannot tell) and nothing usable came back: the uncertain cost is settled as charged"},
            {"command": f"reckon review resolve {job_id} --retry",
             "why": "it never ran: the uncertain cost returns to the reservation and one more attempt is allowed"},
            {"command": f"reckon job show {job_id}",
             "why": "the whole record as the CLI prints it, with what this page leaves out (the error's detail, "
                    "each output's sha256)"},
        ]}
    for secret in (CANARY, SHA, "KSampler", "/outputs/", "href", "blob"):
        assert secret not in resp.text, secret
    assert api_key not in resp.text


def test_a_dead_letter_never_shows_its_detail_and_the_lists_link_both_kinds(settings, store, tenant) -> None:
    client, api_key = page_client(settings, store), tenant()
    dead, review = submit(client, api_key, "dead"), submit(client, api_key, "review")
    dead_letter(store, dead, "sim")
    to_review(store, review, "sim", store.server_ms())
    resp = client.simulate_get(f"/ui/jobs/{dead}.json", headers=auth(TOKEN))
    assert (resp.json["job"]["state"], resp.json["job"]["error"]) == (
        "failed", {"class": "provider_rejected", "reason": "policy"})
    assert [c["command"] for c in resp.json["commands"]] == [
        f"reckon dlq replay {dead}", "reckon tenant show acme", f"reckon job show {dead}"]
    assert CANARY not in resp.text and CANARY in store.job(dead)["error_detail"]  # the probe works
    lists = client.simulate_get("/ui/jobs.json", headers=auth(TOKEN))
    assert [(row["id"], row["class"], row["error_class"], row["reason"]) for row in lists.json["dead_letters"]] == [
        (dead, "interactive", "provider_rejected", "policy")]
    assert [(row["id"], row["error_class"], row["reason"]) for row in lists.json["needs_review"]] == [
        (review, "needs_review", "no_record")]
    assert CANARY not in lists.text and SHA not in lists.text


# -- the page in a browser -------------------------------------------------------------------------


def post_job(web, api_key: str, key: str) -> str:
    workflow = {"9": {"class_type": "KSampler", "inputs": {"seed": 5, "text": CANARY}}}
    headers = {**auth(api_key), "Idempotency-Key": f"{key}-{CANARY}", "Content-Type": "application/json"}
    code, _, raw = web.request("POST", "/v1/jobs", orjson.dumps(job_body(workflow=workflow)), headers)
    assert code == 202, raw
    return orjson.loads(raw)["id"]


def cells(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def test_the_page_shows_a_job_follows_it_and_opens_the_listed_ones(web, chromium, store, tenant) -> None:
    from playwright.sync_api import expect, sync_playwright

    api_key = tenant("acme", 10**6)
    review, dead = post_job(web, api_key, "review"), post_job(web, api_key, "dead")
    t = store.server_ms()
    to_review(store, review, "comfyui", t)  # the web process's one server (RECKON_PROVIDERS unset)
    dead_letter(store, dead, "comfyui")
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(chromium.endpoint)
        context = browser.new_context()
        page = context.new_page()
        problems: list[str] = []
        page.on("console", lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None)
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.goto(f"{web.url}/ui/jobs/{review}?token={TOKEN}&every=1")
        assert page.url == f"{web.url}/ui/jobs/{review}?every=1"  # the token left the address
        expect(page.locator("#job-state")).to_have_text("needs_review", timeout=10_000)

        record = store.job(review)
        assert cells(page, "#fields td[id]") == [
            "acme", "needs_review", f"review expires {iso(t + 5_000 + WEEK_MS)}", "no", "interactive", "image",
            "1 of 1", "1 of 3 allowed", "needs_review (no_record)", "no", "no", "\u2014", "\u2014",
            iso(record["deadline"]), iso(record["created_at"]), iso(t + 5_000), "\u2014"]
        # 3 attempts of 1 output at 10: the submitted attempt's whole run is uncertain (its charge unbooked)
        assert cells(page, "#cost td") == ["10", "10", "30", "20", "0", "10", "0"]
        assert cells(page, '#attempts tr[data-attempt="1"] td') == [
            "1", "unknown", "comfyui", "comfyui", "w-1", "1", "10", "op-review", iso(t + 1_000), iso(t + 2_000),
            iso(t + 3_000), "unknown_outcome"]
        timeline = page.locator("#timeline tbody tr")
        assert [timeline.nth(n).get_attribute("data-type") for n in range(timeline.count())] == [
            "state", "state", "progress", "state", "state"]
        assert cells(page, "#timeline tbody td:nth-child(3)") == [
            "queued", "queued \u2192 running", "progress", "running \u2192 reconciling",
            "reconciling \u2192 needs_review"]
        assert cells(page, "#timeline tbody td:nth-child(4)") == [
            "admitted", "claimed", "attempt 1, node 9: 7 of 20", "unknown_outcome", "no_record"]
        assert cells(page, "#timeline tbody td:nth-child(2)")[2] == iso(t + 1_500)
        assert cells(page, "#commands pre") == [f"reckon review resolve {review} --completed",
                                                f"reckon review resolve {review} --failed",
                                                f"reckon review resolve {review} --retry", f"reckon job show {review}"]
        expect(page.locator(f'#needs-review tr[data-job="{review}"] a')).to_have_text(review)
        assert cells(page, f'#dead-letters tr[data-job="{dead}"] td')[:4] == [
            dead, "interactive", "provider_rejected", "policy"]

        page.evaluate("window.sameDocument = true")
        store.resolve_review(review, "retry", reason="operator_retry")  # as `reckon review resolve --retry` does
        expect(page.locator("#job-state")).to_have_text("queued", timeout=10_000)
        assert page.evaluate("window.sameDocument") is True  # no reload: the page polled the job
        assert cells(page, "#commands pre") == ["reckon status", f"reckon job show {review}"]
        assert cells(page, "#timeline tbody td:nth-child(4)")[-1] == "operator_retry"

        page.locator(f'#dead-letters tr[data-job="{dead}"] a').click()
        page.wait_for_url(f"{web.url}/ui/jobs/{dead}")
        expect(page.locator("#job-state")).to_have_text("failed", timeout=10_000)
        assert page.locator("#job-error").inner_text() == "provider_rejected (policy)"
        assert cells(page, "#commands pre") == [f"reckon dlq replay {dead}", "reckon tenant show acme",
                                                f"reckon job show {dead}"]

        page.fill("#job-id", review)
        page.press("#job-id", "Enter")
        page.wait_for_url(f"{web.url}/ui/jobs/{review}")
        expect(page.locator("#job-state")).to_have_text("queued", timeout=10_000)
        assert CANARY not in page.content() and SHA not in page.content()
        assert problems == []  # no script error, no refused inline script or style (CSP)

        page.goto(f"{web.url}/ui/jobs/acme.nope")
        expect(page.locator("#error")).to_have_text(
            "acme.nope: Invalid job id: a job id is <tenant>.<20 lower-case hex digits>", timeout=10_000)
        page.goto(f"{web.url}/ui/jobs/acme.0123456789abcdef0123")
        expect(page.locator("#error")).to_have_text("acme.0123456789abcdef0123: Job not found", timeout=10_000)
        assert page.locator("#job").is_hidden()
        context.close()
        browser.close()
