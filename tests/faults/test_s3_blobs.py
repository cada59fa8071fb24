"""Two hosts that share nothing but an S3-compatible bucket: a worker stores a job's outputs there, and
a web process with its own, empty blob directory serves them (moto's server on loopback is the bucket)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until
from tests.s3server import CREDENTIALS, S3Server, running


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    with running(tmp_path) as server:
        yield server


def test_outputs_a_worker_stores_in_s3_are_served_by_a_web_process_on_another_host(
        stack, s3: S3Server, redis_client, tmp_path: Path) -> None:
    bucket = s3.bucket()
    create_tenant(redis_client, "acme", 1_000)
    auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
    stack.env |= {**CREDENTIALS, "RECKON_BLOB_URL": f"s3://{bucket}/outputs", "RECKON_S3_ENDPOINT": s3.endpoint}
    stack.start_provider()
    web_dir, worker_dir = tmp_path / "web-host-blobs", tmp_path / "worker-host-blobs"
    stack.env["RECKON_BLOB_DIR"] = str(web_dir)
    stack.start_web()
    stack.env["RECKON_BLOB_DIR"] = str(worker_dir)
    stack.start_worker()

    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 7}}}, "outputs": 2}
    status, headers, _ = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "s3-1"})
    assert status == 202

    def job() -> dict:
        return orjson.loads(stack.api("GET", headers["location"], **auth)[2])

    wait_until(lambda: job()["state"] == "completed", timeout=30)
    outputs = job()["outputs"]
    assert len(outputs) == 2
    assert s3.keys(bucket) == sorted(f"outputs/{o['sha256'][:2]}/{o['sha256'][2:4]}/{o['sha256']}" for o in outputs)
    for output in outputs:
        status, _, data = stack.api("GET", output["href"], **auth)
        assert (status, hashlib.sha256(data).hexdigest(), len(data)) == (200, output["sha256"], output["bytes"])
    assert not web_dir.exists() and not worker_dir.exists()  # no host kept a copy: the bucket is the store

    gone = outputs[0]["sha256"]
    s3.client().delete_object(Bucket=bucket, Key=f"outputs/{gone[:2]}/{gone[2:4]}/{gone}")
    status, _, raw = stack.api("GET", outputs[0]["href"], **auth)
    assert (status, orjson.loads(raw)["type"]) == (410, "urn:reckon:problem:output-missing")
    stack.stop()  # flush every log
    logs = "".join(path.read_text(errors="replace") for path in stack.logs.glob("*.log"))
    assert "is missing from blob storage" in logs  # the logs were really read
    for secret in (CREDENTIALS["AWS_SECRET_ACCESS_KEY"], CREDENTIALS["AWS_ACCESS_KEY_ID"], bucket, gone[:12]):
        assert secret not in logs
