"""``Client.upload`` against the API under gunicorn: a path or bytes, typed by the API from the bytes, the same
answer for the same bytes; a job naming the upload runs on it, one naming another tenant's raises InputUnknown.
And a chunked body (no Content-Length) over the limit is refused by the deployed server (that it is read only up
to the limit: tests/api/test_inputs.py)."""

from __future__ import annotations

import hashlib
import http.client
from pathlib import Path

import orjson
import pytest
from reckon.client import Client, InputUnknown, InvalidRequest

from pipeline.state.tenants import create_key, create_tenant

LIMIT = 1_000_000
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


@pytest.fixture(autouse=True)
def small_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autouse fixtures run first, so gunicorn (the ``web`` fixture) inherits this."""
    monkeypatch.setenv("RECKON_INPUT_MAX_BYTES", str(LIMIT))


def img2img(name: str) -> dict:
    return {"kind": "image", "outputs": 1, "workflow": {
        "1": {"class_type": "LoadImage", "inputs": {"image": name}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inverted"}}}}


def test_upload_a_path_or_bytes_then_name_it_in_a_job(web, redis_client, tmp_path: Path) -> None:
    for tenant in ("acme", "other"):
        create_tenant(redis_client, tenant, 1_000)
    acme = Client(web.url, create_key(redis_client, "acme"))
    other = Client(web.url, create_key(redis_client, "other"))
    picture = tmp_path / "in.png"
    picture.write_bytes(PNG)
    sha = hashlib.sha256(PNG).hexdigest()
    answer = acme.upload(picture)
    assert answer == {"name": f"reckon/{sha}.png", "sha256": sha, "bytes": len(PNG), "content_type": "image/png"}
    assert acme.upload(PNG, content_type="image/png") == answer
    job = acme.submit("img2img", img2img(answer["name"]))
    assert acme.job(job["id"])["inputs"] == [{"sha256": sha}]
    with pytest.raises(InputUnknown) as refused:
        other.submit("theirs", img2img(answer["name"]))
    assert (refused.value.status, refused.value.name, refused.value.problem["names"]) == (
        422, "input-unknown", [answer["name"]])
    with pytest.raises(InvalidRequest) as wrong:
        acme.upload(PNG, content_type="image/jpeg")
    assert (wrong.value.status, wrong.value.name) == (415, "input-type-unsupported")


def test_a_chunked_upload_over_the_limit_is_413_under_gunicorn(web, redis_client) -> None:
    create_tenant(redis_client, "acme", 1_000)
    key = create_key(redis_client, "acme")

    def chunks():
        yield PNG
        for _ in range(4 * LIMIT // 65536):
            yield b"\x00" * 65536

    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
    try:
        conn.request("POST", "/v1/inputs", body=chunks(), encode_chunked=True,
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "image/png"})
        resp = conn.getresponse()
        status, problem = resp.status, orjson.loads(resp.read())
    except (BrokenPipeError, ConnectionResetError):  # the server answered and closed while we still sent
        resp = conn.getresponse()
        status, problem = resp.status, orjson.loads(resp.read())
    finally:
        conn.close()
    assert (status, problem["type"], problem["limit"]) == (413, "urn:reckon:problem:input-too-large", LIMIT)
