"""An input uploaded for a tenant through the real API in-process (``POST /v1/inputs`` on
``create_app``), for tests whose subject is what happens to the input next."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from falcon import testing

from api.app import create_app
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.tenants import create_key


def upload(store: Store, settings: Settings, data: bytes, tenant: str = "acme", *,
           blob_dir: str | Path | None = None) -> str:
    """Upload ``data`` as ``tenant``'s input (to ``blob_dir`` if given, else the settings'); returns its
    name (``reckon/<sha256>.<ext>``)."""
    if blob_dir is not None:
        settings = dataclasses.replace(settings, blob_dir=str(blob_dir))
    headers = {"Authorization": f"Bearer {create_key(store.redis, tenant)}",
               "Content-Type": "application/octet-stream"}
    result = testing.TestClient(create_app(settings, store=store)).simulate_post("/v1/inputs", body=data,
                                                                                headers=headers)
    assert result.status_code in (200, 201), result.text
    return str(result.json["name"])
