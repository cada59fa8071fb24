"""GET /v1/usage/records: one row per booking, the tenant's own, newest first, paged; bad parameters 400."""

from __future__ import annotations

import jsonschema
import orjson
import pytest
from falcon import testing

from pipeline.state.keys import JobKeys
from pipeline.state.records import COLUMNS
from pipeline.state.store import Store
from tests.api.conftest import auth
from tests.pipeline.test_adjustments import admit, complete

T0 = 1_796_000_000_000  # 2026-11-30T00:53:20Z


def booked(store: Store, tenant: str, n: int) -> list[str]:
    """n jobs of ``tenant``, job i settled at T0 + 1000 i (charged 10 + i), the first adjusted at T0 + 500."""
    jobs = []
    for i in range(n):
        job = f"{tenant}.{i + 1:020x}"
        admit(store, job, 60, now_ms=T0 - 10_000)
        complete(store, job, 10 + i, now_ms=T0 + 1000 * i - 3)
        jobs.append(job)
    store.adjust(jobs[0], 5, "late-1", "late charge", attempt=1, now_ms=T0 + 500)
    return jobs


def get(client: testing.TestClient, key: str, **params: str) -> testing.Result:
    return client.simulate_get("/v1/usage/records", params=params, headers=auth(key))


def test_rows_newest_first_paged_in_a_window_and_only_the_tenants_own(client, store, tenant) -> None:
    key = tenant("acme", 10_000)
    tenant("other", 10_000)
    jobs = booked(store, "acme", 4)
    booked(store, "other", 2)
    first = get(client, key, limit="2")
    assert first.status_code == 200
    rows = first.json["records"]
    assert [(r["kind"], r["job"], r["units"]) for r in rows] == [("charge", jobs[3], 13), ("charge", jobs[2], 12)]
    assert rows[0] == {"at": "2026-11-30T00:53:23.000Z", "kind": "charge", "booking_id": f"charge:{jobs[3]}:1",
                       "job": jobs[3], "attempt": 1, "server": "sim", "operation_id": f"op-{jobs[3]}",
                       "seconds": None, "units": 13, "reason": None}
    assert set(rows[0]) == set(COLUMNS)
    seen, cursor = list(rows), first.json["next_cursor"]
    while cursor:
        page = get(client, key, limit="2", cursor=cursor).json
        seen += page["records"]
        cursor = page["next_cursor"]
    assert [(r["kind"], r["booking_id"], r["units"]) for r in seen] == [
        ("charge", f"charge:{jobs[3]}:1", 13), ("charge", f"charge:{jobs[2]}:1", 12),
        ("charge", f"charge:{jobs[1]}:1", 11), ("adjustment", "late-1", 5), ("charge", f"charge:{jobs[0]}:1", 10)]
    assert seen[3]["operation_id"] == f"op-{jobs[0]}" and seen[3]["reason"] == "late charge"
    assert all(r["job"].startswith("acme.") for r in seen)
    window = get(client, key, **{"from": "2026-11-30T00:53:20.400Z", "to": "2026-11-30T00:53:21.000Z"}).json
    assert [r["booking_id"] for r in window["records"]] == [f"charge:{jobs[1]}:1", "late-1"]
    assert window["next_cursor"] is None


def test_bad_parameters_are_problems(client, store, tenant) -> None:
    key = tenant("acme", 100)
    for params in ({"from": "yesterday"}, {"to": "2026-11-30T00:53:20"}, {"cursor": "!!"}, {"limit": "0"},
                   {"limit": "501"}, {"cursor": "12.abc"}, {"cursor": "x.00"}):
        result = get(client, key, **params)
        assert result.status_code == 400, params
        assert result.headers["content-type"] == "application/problem+json"
        assert orjson.loads(result.content)["type"].endswith("invalid-parameter")
    assert get(client, key).json == {"records": [], "next_cursor": None}
    backwards = {"from": "2026-11-30T00:40:00Z", "to": "2026-11-29T00:00:00Z"}  # an empty window, not an error
    assert get(client, key, **backwards).json == {"records": [], "next_cursor": None}


def test_the_job_view_gives_its_cost_per_attempt_with_seconds_and_its_adjustments(client, store, tenant) -> None:
    key = tenant("acme", 1000)
    job = "acme." + "9" * 20
    admit(store, job, 30, now_ms=T0)
    claim = store.claim(job, worker="w", now_ms=T0 + 1, lease_ms=1000, operation_id="p1", servers={"gpu-a": 10})
    assert claim is not None
    store.mark_submit(claim, now_ms=T0 + 2, epoch="e", lease_ms=1000)
    store.charge(claim, 10)
    attempts = JobKeys(job).attempts  # the seconds the provider reported (issue 32 section 1 writes them)
    store.redis.hset(attempts, "1", orjson.dumps({**orjson.loads(store.redis.hget(attempts, "1")), "seconds_ms": 4250}))
    store.store_output(claim, 0, {"sha256": "a" * 64, "bytes": 9, "content_type": "image/png"}, now_ms=T0 + 3)
    store.finish(claim, "completed", now_ms=T0 + 4)
    plain = client.simulate_get(f"/v1/jobs/{job}", headers=auth(key)).json["cost"]
    assert plain == {"price": 10, "ceiling": 30, "reserved": 0, "uncertain": 0, "settled": 10,
                     "attempts": [{"attempt": 1, "server": "gpu-a", "units": 10, "seconds": 4.25}]}
    store.adjust(job, 3, "statement-2026-11:p1", "late GPU seconds", attempt=1, now_ms=T0 + 10_000)
    cost = client.simulate_get(f"/v1/jobs/{job}", headers=auth(key)).json["cost"]
    assert cost == {**plain, "adjusted": 3, "adjustments": [
        {"id": "statement-2026-11:p1", "attempt": 1, "units": 3, "reason": "late GPU seconds",
         "at": "2026-11-30T00:53:30.000Z"}]}
    schema = client.simulate_get("/openapi.json").json
    jsonschema.validate(client.simulate_get(f"/v1/jobs/{job}", headers=auth(key)).json,
                        {**schema["components"]["schemas"]["Job"], "components": schema["components"]})
    listed = client.simulate_get("/v1/jobs", headers=auth(key)).json["jobs"][0]["cost"]
    assert listed == {k: v for k, v in cost.items()} | {"attempts": [{"attempt": 1, "server": "gpu-a", "units": 10}]}


def test_a_cursor_after_the_longest_booking_id_is_taken_back(client, store, tenant) -> None:
    key = tenant("acme", 10_000)
    jobs = booked(store, "acme", 2)
    longest = "\u20ac" * 200  # 200 printable characters, 600 bytes of UTF-8: the longest id adjust takes
    store.adjust(jobs[1], 3, longest, "euro", now_ms=T0 + 1500)
    store.adjust(jobs[1], 4, longest[1:] + "a", "euro", now_ms=T0 + 1500)  # the same ms: the cursor names an id
    first = get(client, key, limit="1").json
    assert [r["booking_id"] for r in first["records"]] == [longest]
    second = get(client, key, limit="4", cursor=first["next_cursor"])
    assert second.status_code == 200, second.json
    assert [r["booking_id"] for r in second.json["records"]] == [
        longest[1:] + "a", f"charge:{jobs[1]}:1", "late-1", f"charge:{jobs[0]}:1"]


def test_an_adjustment_cannot_take_the_id_of_a_charge_or_a_hold(client, store, tenant) -> None:
    key = tenant("acme", 10_000)
    jobs = booked(store, "acme", 2)
    before = store.ledger("acme")
    for taken in (f"charge:{jobs[1]}:1", f"uncertain:{jobs[1]}:1"):
        with pytest.raises(ValueError, match="ids beginning charge: and uncertain: are the ids of"):
            store.adjust(jobs[1], 2, taken, "same id as a charge", attempt=1, now_ms=T0 + 997)
    assert store.ledger("acme") == before
    assert [r["booking_id"] for r in get(client, key).json["records"]] == [
        f"charge:{jobs[1]}:1", "late-1", f"charge:{jobs[0]}:1"]


def test_every_page_size_gives_each_row_once_and_ends(client, store, tenant) -> None:
    key = tenant("acme", 10_000)
    jobs = booked(store, "acme", 3)
    store.adjust(jobs[2], 2, "late-2", "late charge", attempt=1, now_ms=T0 + 2000 - 3)  # the same ms as a charge
    every = [f"charge:{jobs[2]}:1", "late-2", f"charge:{jobs[1]}:1", "late-1", f"charge:{jobs[0]}:1"]
    for limit in range(1, 7):
        seen, cursor, pages = [], None, 0
        while pages < 2 * len(every) + 2:  # a page that does not move on would loop for ever
            page = get(client, key, limit=str(limit), **({} if cursor is None else {"cursor": cursor})).json
            seen += [r["booking_id"] for r in page["records"]]
            pages += 1
            if (cursor := page["next_cursor"]) is None:
                break
        assert (seen, cursor) == (every, None), limit
