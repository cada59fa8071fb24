"""The deployed API against its own OpenAPI document: schemathesis with every check, over a socket.

``st run --checks all`` runs all four phases (examples, coverage, fuzzing, stateful) against the app
under gunicorn (ops/gunicorn.conf.py), authenticated with a real key of a real tenant. The seed is
fixed so a failure reproduces; ``st replay`` with the printed case id shows it again.
"""

from __future__ import annotations

import os
import re
import subprocess

import orjson
import pytest
from falcon import testing
from falcon.inspect import inspect_routes

from api.app import create_app
from pipeline.settings import Settings
from pipeline.state.store import Store

from .conftest import BIN, job_body

HOOKS = os.path.join(os.path.dirname(__file__), "st_hooks.py")


@pytest.fixture(autouse=True)
def short_event_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job schemathesis reads stays queued: each event stream would last its whole bound (15 s).
    Autouse fixtures run first, so gunicorn (the ``web`` fixture) inherits this."""
    monkeypatch.setenv("RECKON_SSE_MAX_SECONDS", "0.05")
    # a webhook URL schemathesis makes up may name any host: a private one is a rule of the deployment
    monkeypatch.setenv("RECKON_WEBHOOK_ALLOW_PRIVATE", "1")


def test_the_deployed_api_passes_every_schemathesis_check(web, tenant, tmp_path) -> None:
    api_key = tenant("acme", 10**9)
    status, _, body = web.request("POST", "/v1/jobs", orjson.dumps(job_body()), {
        "Authorization": f"Bearer {api_key}", "Idempotency-Key": "first", "Content-Type": "application/json"})
    assert status == 202, body
    job_id = orjson.loads(body)["id"]
    status, _, body = web.request("POST", "/v1/workflows", orjson.dumps({"name": "saved", "workflow": job_body()["workflow"]}),
                                  {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
    assert status == 201, body  # what st_hooks.py names in a job's workflow_ref
    config = tmp_path / "schemathesis.toml"
    # POST /v1/inputs takes any bytes that are a file ComfyUI reads: schemathesis's "invalid" bodies for it are
    # real files (a GIF sample for image/gif), rightly taken; its other checks still run (st_hooks.py MAGIC)
    config.write_text(f'[auth.openapi.bearer]\nbearer = "{api_key}"\n\n[parameters]\n"path.job_id" = "{job_id}"\n\n'
                      '[checks]\nenabled = true\n\n'
                      '[[operations]]\ninclude-path = "/v1/inputs"\ninclude-method = "POST"\n'
                      'checks.negative_data_rejection.enabled = false\n')
    result = subprocess.run(
        [str(BIN / "st"), "--no-color", "--config-file", str(config), "run", f"{web.url}/openapi.json",
         "--max-examples", "50", "--seed", "1"],
        env=os.environ | {"SCHEMATHESIS_HOOKS": HOOKS, "RECKON_TEST_JOB_ID": job_id},
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )
    assert result.returncode == 0, result.stdout[-10_000:] + result.stderr[-2_000:]
    assert re.search(r"\d+ generated, \d+ passed", result.stdout), result.stdout[-2_000:]


def test_spec_documents_exactly_the_routes_the_app_serves(settings: Settings, store: Store) -> None:
    app = create_app(settings, store=store)
    spec = testing.TestClient(app).simulate_get("/openapi.json").json
    assert spec["openapi"] == "3.1.0"
    served = {re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path) for route in inspect_routes(app)}
    operator_pages = {"/ui", "/ui/status.json",  # behind the operator token, not a tenant's key: not in the spec
                      "/ui/jobs", "/ui/jobs/{job_id}", "/ui/jobs/{job_id}.json", "/ui/jobs.json"}
    assert set(spec["paths"]) == served - operator_pages and operator_pages < served
    assert len(served) == 30  # /v1/usage/records (issue 32), /v1/batches and /v1/workflows (issue 34)
