"""The app against its own OpenAPI document, with schemathesis generating the requests."""

from __future__ import annotations

import re
import uuid

import pytest
import schemathesis
from falcon import testing
from falcon.inspect import inspect_routes
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from api.app import create_app
from api.openapi import SPEC
from pipeline.settings import Settings
from pipeline.store import Store

OPERATIONS = [(path, method) for path, item in SPEC["paths"].items() for method in item]


@pytest.fixture
def app(settings: Settings, store: Store):
    return create_app(settings, store=store)


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m.upper()} {p}" for p, m in OPERATIONS])
def test_app_matches_its_openapi_document(app, tenant, settings: Settings, path: str, method: str) -> None:
    headers = {"Authorization": f"Bearer {tenant('acme', 1_000_000)}"}
    operation = schemathesis.openapi.from_wsgi("/openapi.json", app)[path][method]

    @given(data=st.data())
    @hsettings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(data: st.DataObject) -> None:
        case = data.draw(operation.as_strategy())
        if method == "post":  # a generated key may repeat with another body: each case is a new intent
            case.headers = {**(case.headers or {}), "Idempotency-Key": uuid.uuid4().hex}
            body = case.body if isinstance(case.body, dict) else {}
            body.pop("supersedes", None)  # must name an existing job of the tenant: tested in test_cancel
            if "max_cost" in body and "outputs" in body:
                # A rule JSON Schema cannot state: max_cost covers one attempt (outputs x price).
                body["max_cost"] = max(int(body["max_cost"]), int(body["outputs"]) * settings.price_per_output)
        case.call_and_validate(headers=headers)

    check()


def test_spec_documents_exactly_the_routes_the_app_serves(app) -> None:
    spec = testing.TestClient(app).simulate_get("/openapi.json").json
    assert spec["openapi"] == "3.1.0"
    served = {re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path) for route in inspect_routes(app)}
    assert set(spec["paths"]) == served
    assert len(served) == 11
