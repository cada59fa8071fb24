"""Bad input at the API edge: a stable RFC 9457 problem, nothing written, never a 500."""

from __future__ import annotations

import orjson
import pytest

from api.resources import IDEMPOTENCY_KEY_RE
from pipeline.state.ids import tenant_of
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store

from .conftest import auth, job_body

P = "urn:reckon:problem:"


def nested(depth: int) -> bytes:
    """A job body whose workflow is ``depth`` nested objects (written out: encoders stop at 254)."""
    workflow = b'{"n": ' * (depth - 1) + b'{"seed": 5}' + b"}" * (depth - 1)
    return b'{"kind": "image", "outputs": 1, "workflow": ' + workflow + b"}"


def assert_nothing_written(store: Store) -> None:
    assert store.redis.zcard(TenantKeys("acme").jobs) == 0
    assert store.ledger("acme")["reserved"] == 0
    assert store.redis.keys("reckon:{s0}:t:acme:idem*") == []


def post_raw(client, api_key: str, data: bytes, content_type: str | None = "application/json",
             key: str = "intent-1"):
    headers = auth(api_key) | {"Idempotency-Key": key}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return client.simulate_post("/v1/jobs", body=data, headers=headers)


@pytest.mark.parametrize("depth", [64, 254, 300, 1023])
def test_a_workflow_nested_past_the_limit_is_422_before_anything_else(client, tenant, store, depth) -> None:
    resp = post_raw(client, tenant(), nested(depth))  # the body is one level deeper
    assert resp.status_code == 422
    assert (resp.json["type"], resp.json["field"]) == (P + "invalid-job", "workflow")
    assert "64 levels" in resp.json["detail"]
    assert_nothing_written(store)


def test_a_workflow_at_the_limit_is_accepted(client, tenant) -> None:
    assert post_raw(client, tenant(), nested(63)).status_code == 202


def test_a_deep_body_that_is_not_an_object_is_422(client, tenant, store) -> None:
    resp = post_raw(client, tenant(), b"[" * 1000 + b"]" * 1000)
    assert (resp.status_code, resp.json["type"], resp.json["field"]) == (422, P + "invalid-job", "body")
    assert_nothing_written(store)


@pytest.mark.parametrize("name", ["cursor", "limit"])
@pytest.mark.parametrize("value", ["١٢", "²", "1" * 5000, "1" * 19, "-1", "1.5", " 1", "1\n", "0x10", "+5", ""])
def test_listing_parameters_are_ascii_digits(client, tenant, name, value) -> None:
    resp = client.simulate_get("/v1/jobs", query_string=f"{name}={value}", headers=auth(tenant()))
    assert resp.status_code == 400, resp.text
    assert (resp.json["type"], resp.json["field"]) == (P + "invalid-parameter", name)


def test_a_cursor_of_zero_and_a_limit_in_range_are_accepted(client, tenant) -> None:
    resp = client.simulate_get("/v1/jobs", params={"cursor": "0", "limit": "200"}, headers=auth(tenant()))
    assert (resp.status_code, resp.json) == (200, {"jobs": [], "next_cursor": None})


def test_validation_patterns_refuse_a_trailing_newline(submit, tenant, store) -> None:
    assert IDEMPOTENCY_KEY_RE.fullmatch("abc") and not IDEMPOTENCY_KEY_RE.fullmatch("abc\n")  # HTTP strips it
    with pytest.raises(ValueError):
        tenant_of("acme.0123456789abcdef0123\n")
    resp = submit(tenant(), body=job_body(supersedes="acme.0123456789abcdef0123\n"))
    assert (resp.status_code, resp.json["field"], resp.json["detail"]) == (422, "supersedes", "must be a job id")
    assert_nothing_written(store)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", {}), ("kind", []), ("kind", ["image"]), ("kind", 1), ("kind", None),
        ("priority", []), ("priority", {}), ("priority", ["batch"]), ("priority", 1), ("priority", None),
        ("outputs", "1"), ("outputs", [1]), ("outputs", {}), ("outputs", 1.5), ("outputs", None),
        ("max_cost", {}), ("max_cost", "100"), ("max_cost", None),
        ("deadline_s", []), ("deadline_s", 1.5), ("deadline_s", None),
        ("supersedes", []), ("supersedes", {}), ("supersedes", None), ("supersedes", 5),
        ("workflow", []), ("workflow", "x"), ("workflow", {}),
    ],
)
def test_a_field_of_the_wrong_type_is_422_naming_it(submit, tenant, store, field, value) -> None:
    resp = submit(tenant(), body=job_body(**{field: value}))
    assert resp.status_code == 422, resp.text
    assert (resp.json["type"], resp.json["field"]) == (P + "invalid-job", field)
    assert_nothing_written(store)


@pytest.mark.parametrize(("first", "second"), [
    ({"outputs": 2}, {"outputs": 2.0}),
    ({"outputs": 2.0}, {"outputs": 2}),
    ({"deadline_s": 60, "max_cost": 60}, {"deadline_s": 6e1, "max_cost": 60.0}),
])
def test_integral_floats_in_integer_fields_are_the_same_request(submit, tenant, store, first, second) -> None:
    key = tenant()
    job = submit(key, body=job_body(**first))
    again = submit(key, body=job_body(**second))
    assert (job.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (202, 202, "true")
    assert again.content == job.content
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1


@pytest.mark.parametrize(("first", "second"), [(5, 5.0), (5.0, 5), (1, True)])
def test_numbers_in_the_workflow_are_hashed_as_sent(submit, tenant, store, first, second) -> None:
    key = tenant()
    assert submit(key, body=job_body(workflow={"3": {"inputs": {"seed": first}}})).status_code == 202
    resp = submit(key, body=job_body(workflow={"3": {"inputs": {"seed": second}}}))
    assert (resp.status_code, resp.json["type"]) == (422, P + "idempotency-key-reused")
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b'{"kind": "image", "outputs": 1, "outputs": 2, "workflow": {"3": {}}}', "outputs"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"inputs": {"seed": 5, "seed": 6}}}}', "workflow"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"xs": [1, {"a": 1, "a": 1}]}}}', "workflow"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"text": "a: b", "text": "c: d"}}}', "workflow"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"a": 1, "a": 2, "b": "\\u003a"}}}', "workflow"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"a": 1, "a": 2, "b": "\\u003A"}}}', "workflow"),
        (b'{"kind": "image", "outputs": 1, "workflow": {"3": {"a": 1, "a": 2}}, "workflow": {"3": {}}}', "workflow"),
        (b'[{"a": 1, "a": 2}]', "body"),
    ],
)
def test_a_duplicate_member_name_is_422_anywhere(client, tenant, store, data, field) -> None:
    resp = post_raw(client, tenant(), data)
    assert resp.status_code == 422, resp.text
    assert (resp.json["type"], resp.json["field"]) == (P + "duplicate-member", field)
    assert_nothing_written(store)


def test_two_bodies_that_decode_alike_no_longer_share_a_key(client, tenant, store) -> None:
    key = tenant()
    plain = post_raw(client, key, b'{"kind": "image", "outputs": 2, "workflow": {"3": {}}}')
    doubled = post_raw(client, key, b'{"kind": "image", "outputs": 1, "outputs": 2, "workflow": {"3": {}}}')
    assert (plain.status_code, doubled.status_code, doubled.json["type"]) == (202, 422, P + "duplicate-member")


def test_colons_and_escapes_in_strings_are_not_duplicates(client, tenant) -> None:
    workflow = {"3": {"inputs": {"text": 'style: "anime" \\ {x: [1]}', "ckpt": "a:b:c"}}, "4:x": {"y": "\u003a"}}
    resp = post_raw(client, tenant(), orjson.dumps(job_body(workflow=workflow)))
    assert resp.status_code == 202, resp.text
    escaped = b'{"kind": "image", "outputs": 1, "workflow": {"3": {"y": "\\u003a\\u003A\\\\u003a"}}}'
    resp = post_raw(client, tenant("globex"), escaped)
    assert resp.status_code == 202, resp.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx", "json"])
def test_a_body_that_is_not_json_media_is_415(client, tenant, store, content_type) -> None:
    resp = post_raw(client, tenant(), orjson.dumps(job_body()), content_type=content_type)
    assert (resp.status_code, resp.json["type"]) == (415, P + "unsupported-media-type")
    assert_nothing_written(store)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/vnd.reckon.job+json"])
def test_json_media_types_are_accepted(client, tenant, content_type) -> None:
    resp = post_raw(client, tenant(), orjson.dumps(job_body()), content_type=content_type)
    assert resp.status_code == 202, resp.text


def test_a_dropped_duplicate_nested_past_the_limit_is_422(client, tenant, store) -> None:
    deep = b'{"n": ' * 1000 + b"{}" + b"}" * 1000  # orjson keeps the later, shallow "workflow"
    data = b'{"kind": "image", "outputs": 1, "workflow": ' + deep + b', "workflow": {"3": {}}}'
    resp = post_raw(client, tenant(), data)
    assert (resp.status_code, resp.json["type"], resp.json["field"]) == (422, P + "invalid-job", "body")
    assert_nothing_written(store)
