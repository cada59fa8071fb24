"""Small pieces that need no server: settings, HTTP failure classes, blob storage, PNGs."""

from __future__ import annotations

import hashlib
import os

import fakeredis
import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import (
    InvalidInput,
    InvalidRequest,
    PolicyRejected,
    ProviderAuthFailed,
    RateLimited,
    ScriptError,
    Transient,
    UnknownOutcome,
)
from pipeline.providers.http import Response, raise_for_status, retry_after
from pipeline.providers.sim.comfy import png
from pipeline.settings import Settings, with_db
from pipeline.state.jobs import fingerprint, parse_request
from pipeline.state.scripts import Scripts


def test_settings_read_the_environment_once_and_derive_the_broker_db() -> None:
    settings = Settings.from_env({"RECKON_REDIS_URL": "redis://10.0.0.1:7000/3", "RECKON_LEASE_SECONDS": "2.5",
                                  "RECKON_PRICE_PER_OUTPUT": "7"})
    assert (settings.redis_url, settings.broker_url) == ("redis://10.0.0.1:7000/3", "redis://10.0.0.1:7000/1")
    assert (settings.lease_seconds, settings.price_per_output, settings.max_attempts) == (2.5, 7, 3)
    assert with_db("redis://:pw@h:1", 1) == "redis://:pw@h:1/1"
    with pytest.raises(ValueError):
        Settings.from_env({"RECKON_MAX_ATTEMPTS": "three"})
    with pytest.raises(ValueError, match="at least one prompt"):  # admission divides by the slots
        Settings.from_env({"RECKON_PROVIDER_CAP": "0"}).caps()
    with pytest.raises(ValueError, match="bad option"):
        Settings.from_env({"RECKON_PROVIDERS": "a=http://127.0.0.1:1;cap=0"}).caps()
    with pytest.raises(ValueError, match="RECKON_IDEMPOTENCY_TTL_SECONDS must be at least 1"):  # SET ... EX
        Settings.from_env({"RECKON_IDEMPOTENCY_TTL_SECONDS": "0"})


@pytest.mark.parametrize(
    ("method", "status", "headers", "error"),
    [
        ("POST", 400, {}, InvalidInput),
        ("POST", 401, {}, ProviderAuthFailed),
        ("POST", 403, {}, PolicyRejected),
        ("POST", 429, {"retry-after": "7"}, RateLimited),
        ("POST", 500, {}, UnknownOutcome),  # the prompt may have been queued before the error
        ("GET", 502, {}, Transient),  # reads are safe to repeat
    ],
)
def test_http_failures_are_classified_by_evidence(method, status, headers, error) -> None:
    with pytest.raises(error) as caught:
        raise_for_status(method, Response(status, headers, b""))
    if error is RateLimited:
        assert caught.value.retry_after == 7.0
    assert raise_for_status(method, Response(200, {}, b"")) is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("120") == 120.0
    assert retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after("soon") is None and retry_after(None) is None


def test_blobs_are_content_addressed_and_written_whole(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    digest = blobs.put(b"image bytes")
    assert digest == hashlib.sha256(b"image bytes").hexdigest()
    assert blobs.path(digest) == tmp_path / digest[:2] / digest[2:4] / digest
    assert blobs.read(digest) == b"image bytes"
    assert blobs.put(b"image bytes") == digest
    assert [p.name for p in blobs.path(digest).parent.iterdir()] == [digest]  # no temp files left
    with pytest.raises(ValueError):
        blobs.path("../etc/passwd")


def test_simulated_pngs_differ_per_seed_and_are_valid() -> None:
    first, second = png("op:0:1"), png("op:1:1")
    assert first != second
    assert first.startswith(b"\x89PNG\r\n\x1a\n") and first.endswith(b"IEND\xaeB`\x82")
    assert os.path.commonprefix([first, second]).startswith(b"\x89PNG")


def test_parse_request_and_fingerprint_refuse_what_orjson_cannot_encode() -> None:
    def deep(depth: int) -> dict:
        return orjson.loads(b'{"n": ' * (depth - 1) + b"{}" + b"}" * (depth - 1))

    body = {"kind": "image", "outputs": 1}
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body | {"workflow": deep(300)}, Settings())
    assert caught.value.field == "workflow"
    parse_request(body | {"workflow": deep(254)}, Settings())  # the API refuses it earlier (64 levels)
    with pytest.raises(InvalidRequest):
        fingerprint(body | {"workflow": deep(254)})  # the body is one level deeper than orjson encodes


def test_retry_after_reads_only_ascii_seconds() -> None:
    assert [retry_after(v) for v in ("12", "²", "١٢", "9" * 5000)] == [12.0, None, None, None]


def test_script_names_are_verbs_and_headers_state_an_ascii_key_count(tmp_path) -> None:
    (tmp_path / "_lib.lua").write_text("")
    (tmp_path / "ping.lua").write_text("-- keys: 1\n-- KEYS[1] a key\nreturn 1")
    assert Scripts(fakeredis.FakeRedis(), lua_dir=tmp_path).verbs == ["ping"]
    for name in ("Ping.lua", "pong-1.lua", "take_due.lua"):
        (tmp_path / name).write_text("-- keys: 1\n-- KEYS[1] a key\nreturn 1")
        with pytest.raises(ScriptError, match="named after its verb"):
            Scripts(fakeredis.FakeRedis(), lua_dir=tmp_path)
        (tmp_path / name).unlink()
    for header in ("-- keys: ١\n-- KEYS[1] a key", "-- keys: 2\n-- KEYS[1] a key", "-- KEYS[1] a key"):
        (tmp_path / "pong.lua").write_text(header + "\nreturn 1")
        with pytest.raises(ScriptError):
            Scripts(fakeredis.FakeRedis(), lua_dir=tmp_path)
