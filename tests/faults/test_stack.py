"""The whole stack as separate processes, driven over HTTP like a client would."""

from __future__ import annotations

import hashlib

import orjson

from pipeline.tenants import create_key, create_tenant
from tests.conftest import wait_until


def test_full_run_over_http(stack, redis_client) -> None:
    create_tenant(redis_client, "acme", 1_000)
    auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
    stack.start_provider(delay=0.05)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()

    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler"}}, "outputs": 2}
    status, headers, raw = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "e2e-1"})
    assert status == 202
    location = headers["location"]

    def job() -> dict:
        return orjson.loads(stack.api("GET", location, **auth)[2])

    wait_until(lambda: job()["state"] == "completed", timeout=30)
    done = job()
    assert (done["attempt_count"], done["cost"]) == (1, {"ceiling": 60, "reserved": 0, "uncertain": 0, "settled": 20})
    for output in done["outputs"]:
        status, headers, data = stack.api("GET", output["href"], **auth)
        assert status == 200 and headers["etag"] == f'"{output["sha256"]}"'
        assert hashlib.sha256(data).hexdigest() == output["sha256"] and len(data) == output["bytes"]
    usage = orjson.loads(stack.api("GET", "/v1/usage", **auth)[2])
    assert usage == {"allowance": 1_000, "reserved": 0, "uncertain": 0, "settled": 20, "available": 980}
    assert usage["allowance"] == usage["available"] + usage["reserved"] + usage["uncertain"] + usage["settled"]
    charges = stack.charges()
    assert (len(charges["charges"]), charges["total_units"]) == (1, 20)
    # A retry of the same request, after completion, replays the first response and charges nothing.
    status, headers, again = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "e2e-1"})
    assert (status, headers["idempotent-replayed"], again) == (202, "true", raw)
    assert stack.charges()["total_units"] == 20
