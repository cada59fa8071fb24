from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from falcon import testing

from api.app import create_app
from pipeline.settings import Settings
from pipeline.store import Store

WORKFLOW = {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}


def job_body(**overrides: Any) -> dict[str, Any]:
    return {"kind": "image", "workflow": WORKFLOW, "outputs": 1, **overrides}


@pytest.fixture
def client(settings: Settings, store: Store) -> testing.TestClient:
    return testing.TestClient(create_app(settings, store=store))


@pytest.fixture
def submit(client: testing.TestClient) -> Callable[..., testing.Result]:
    def post(api_key: str, key: str | None = "intent-1", body: Any = None, **kw: Any) -> testing.Result:
        headers = {"Authorization": f"Bearer {api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return client.simulate_post("/v1/jobs", json=job_body() if body is None else body, headers=headers, **kw)

    return post


def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}
