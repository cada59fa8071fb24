"""GET /v1/jobs/{id}/outputs/{index}: stored bytes, and a clear problem when they are gone."""

from __future__ import annotations

import hashlib
import io
import logging

import orjson

from pipeline.blobs.local import BlobStore
from pipeline.state.keys import JobKeys

from .conftest import auth

PNG = b"\x89PNG\r\n\x1a\n stored bytes"
DIGEST = hashlib.sha256(PNG).hexdigest()


def record_output(store, job_id: str) -> None:
    """What the worker's store-output records once the bytes are durable."""
    store.redis.hset(JobKeys(job_id).outputs, "0", orjson.dumps(
        {"sha256": DIGEST, "bytes": len(PNG), "content_type": "image/png"}))


def test_a_missing_blob_is_410_and_its_location_is_never_logged_or_returned(
        client, submit, tenant, store, settings, caplog) -> None:
    key = tenant()
    job_id = submit(key).json["id"]
    record_output(store, job_id)
    url, errors = f"/v1/jobs/{job_id}/outputs/0", io.StringIO()
    with caplog.at_level(logging.DEBUG):
        resp = client.simulate_get(url, headers=auth(key), extras={"wsgi.errors": errors})
    assert (resp.status_code, resp.json["type"]) == (410, "urn:reckon:problem:output-missing")
    logged = caplog.text + errors.getvalue()
    assert f"output 0 of job {job_id} is missing" in logged
    for secret in (settings.blob_dir, DIGEST[:16]):
        assert secret not in logged and secret not in resp.text


def test_stored_bytes_are_served_and_an_unreadable_blob_is_503(client, submit, tenant, store, settings) -> None:
    key = tenant()
    job_id = submit(key).json["id"]
    record_output(store, job_id)
    blobs = BlobStore(settings.blob_dir)
    assert blobs.put(PNG) == DIGEST
    resp = client.simulate_get(f"/v1/jobs/{job_id}/outputs/0", headers=auth(key))
    assert (resp.status_code, resp.content, resp.headers["ETag"]) == (200, PNG, f'"{DIGEST}"')
    blobs.path(DIGEST).unlink()
    blobs.path(DIGEST).mkdir()  # reading it now fails with an I/O error other than "not found"
    resp = client.simulate_get(f"/v1/jobs/{job_id}/outputs/0", headers=auth(key))
    assert (resp.status_code, resp.json["type"], resp.headers["Retry-After"]) == (
        503, "urn:reckon:problem:output-unavailable", "5")
    assert settings.blob_dir not in resp.text
