"""The whole stack as separate processes, driven over HTTP like a client would."""

from __future__ import annotations

import hashlib

import orjson

from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until


def test_full_run_over_http(stack, redis_client, store) -> None:
    create_tenant(redis_client, "acme", 1_000)
    api_key = create_key(redis_client, "acme")
    auth = {"Authorization": f"Bearer {api_key}"}
    stack.start_provider(delay=0.05)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()

    secret = "a castle at dusk, private-prompt-7f3a"
    body = {"kind": "image", "workflow": {"6": {"class_type": "CLIPTextEncode", "inputs": {"text": secret}}},
            "outputs": 2}
    status, headers, raw = stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": "e2e-1"})
    assert status == 202
    location = headers["location"]

    def job() -> dict:
        return orjson.loads(stack.api("GET", location, **auth)[2])

    wait_until(lambda: job()["state"] == "completed", timeout=30)
    done = job()
    assert (done["attempt_count"], done["cost"]) == (1, {"price": 10, "ceiling": 60, "reserved": 0, "uncertain": 0,
                                                        "settled": 20, "attempts": [
                                                            {"attempt": 1, "server": "comfyui", "units": 20}]})
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
    # Nothing a process logged, and no event or attempt, holds the prompt, an output URL or the key.
    stack.stop()
    logs = "".join(path.read_text(errors="replace") for path in stack.logs.glob("*.log"))
    job_id = location.rsplit("/", 1)[1]
    history = orjson.dumps([store.events(job_id), store.attempts(job_id)]).decode()
    for private in (secret, api_key, *(output["href"] for output in done["outputs"])):
        assert private not in logs and private not in history
    assert "booting" in logs.lower() or "listening" in logs.lower()  # the logs were really read
