"""The client against the API alone under gunicorn, through a recording proxy: a 429 is retried
with the same key no sooner than its Retry-After; every other refusal raises its type, sent once."""

from __future__ import annotations

import time

import pytest
from reckon.client import (
    Client,
    IdempotencyKeyReused,
    InsufficientAllowance,
    InvalidRequest,
    JobNotFound,
    ReckonError,
    Unauthorized,
)

from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import create_key, create_tenant, set_limits
from tests.client.conftest import job_body

PROBLEM = "urn:reckon:problem:"


def test_a_429_is_retried_with_the_same_key_after_its_retry_after(web, proxy, redis_client) -> None:
    create_tenant(redis_client, "acme", 1_000)
    set_limits(redis_client, "acme", rate=0.5, burst=1)  # one submission, then one every 2 s
    front = proxy(web.port)
    client = Client(front.url, create_key(redis_client, "acme"), deadline=30)
    first = client.submit("first", job_body())  # takes the bucket's only token
    started = time.monotonic()
    second = client.submit("second", job_body())
    elapsed = time.monotonic() - started

    posts = front.requests(b"POST /v1/jobs ")
    assert [(p.header("Idempotency-Key"), p.status) for p in posts] == [("first", 202), ("second", 429),
                                                                         ("second", 202)]
    limited, admitted = posts[1], posts[2]
    assert (limited.header("Retry-After", answer=True), admitted.header("Idempotent-Replayed", answer=True)) == (
        "2", None)
    assert admitted.opened - limited.opened >= 2 and elapsed >= 2
    assert bytes(limited.request).split(b"\r\n\r\n", 1)[1] == bytes(admitted.request).split(b"\r\n\r\n", 1)[1]
    assert first["id"] != second["id"] and second["state"] == "queued"
    assert len(redis_client.zrange(TenantKeys("acme").jobs, 0, -1)) == 2


def test_each_refusal_raises_its_type_and_is_sent_once(web, proxy, redis_client) -> None:
    create_tenant(redis_client, "acme", 1_000)
    create_tenant(redis_client, "poor", 1)
    front = proxy(web.port)
    client = Client(front.url, create_key(redis_client, "acme"), deadline=30)
    poor = Client(front.url, create_key(redis_client, "poor"), deadline=30)
    stranger = Client(front.url, "not-a-key", deadline=30)
    client.submit("reused", job_body())

    cases = [
        (lambda: client.submit("bad-outputs", job_body(outputs=0)), InvalidRequest, 422, "invalid-job"),
        (lambda: client.submit("reused", job_body(outputs=2)), IdempotencyKeyReused, 422, "idempotency-key-reused"),
        (lambda: poor.submit("too-dear", job_body()), InsufficientAllowance, 402, "insufficient-allowance"),
        (lambda: stranger.submit("no-key", job_body()), Unauthorized, 401, "unauthorized"),
        (lambda: client.job("acme.0123456789abcdef0123"), JobNotFound, 404, "job-not-found"),
    ]
    for call, expected, status, name in cases:
        before = len(front.exchanges)
        with pytest.raises(ReckonError) as raised:
            call()
        assert (type(raised.value), raised.value.status, raised.value.type) == (expected, status, PROBLEM + name)
        assert len(front.exchanges) == before + 1, name  # nothing retried
    invalid = _raised(lambda: client.submit("bad-outputs", job_body(outputs=0)))
    assert (invalid.problem["field"], invalid.name) == ("outputs", "invalid-job")
    assert _raised(lambda: poor.submit("too-dear", job_body())).problem | {"title": None, "detail": None} == {
        "type": PROBLEM + "insufficient-allowance", "title": None, "status": 402, "detail": None,
        "available": 1, "required": 30}
    assert len(redis_client.zrange(TenantKeys("acme").jobs, 0, -1)) == 1  # only "reused"'s first


def _raised(call) -> ReckonError:
    with pytest.raises(ReckonError) as raised:
        call()
    return raised.value
