"""``Prefer: wait`` on the web process (api/waiting.py), in process against the real redis-server: a held
request answers when its job ends or its wait is over, a replayed POST waits too, a bad preference is
ignored and changes nothing, and no more requests are held at once than the process's stream slots."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from falcon import testing

from api.app import create_app
from pipeline.state.store import Store
from tests.conftest import wait_until

from .conftest import auth, job_body


def finish(store: Store, job_id: str, state: str = "completed") -> None:
    claim = store.claim(job_id, worker="w", lease_ms=30_000, operation_id=f"op-{job_id}", servers={"sim": 1000})
    assert claim is not None
    if state == "completed":
        store.store_output(claim, 0, {"sha256": "a" * 64})
    store.finish(claim, state, **({} if state == "completed" else {"error_class": "invalid_input"}))


def post(client: testing.TestClient, key: str, intent: str, prefer: str | None = None) -> testing.Result:
    headers = {**auth(key), "Idempotency-Key": intent, **({"Prefer": prefer} if prefer else {})}
    return client.simulate_post("/v1/jobs", json=job_body(), headers=headers)


def get(client: testing.TestClient, key: str, job_id: str, prefer: str | None = None) -> testing.Result:
    return client.simulate_get(f"/v1/jobs/{job_id}", headers={**auth(key), **({"Prefer": prefer} if prefer else {})})


def in_thread(call: Any) -> tuple[threading.Thread, list[testing.Result]]:
    answers: list[testing.Result] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return thread, answers


def hgets(store: Store) -> int:
    """HGETs Redis has served: a held request reads its job's state with one every poll."""
    return int(store.redis.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))


def plain_read(client: testing.TestClient, key: str, job_id: str, store: Store) -> int:
    """The HGETs of a read not held (the key's trust warmed first): what a held read sends besides its polls."""
    get(client, key, job_id)
    before = hgets(store)
    assert get(client, key, job_id).json["state"] == "queued"
    return hgets(store) - before


def held(store: Store, since: int) -> bool:
    """Whether a request is held: two polls' HGETs more than ``since`` (its count, and a plain read's)."""
    return hgets(store) >= since + 2


def test_a_held_get_answers_with_the_job_it_waited_for(client, tenant, store: Store) -> None:
    key = tenant()
    job_id = post(client, key, "one").json["id"]
    before = plain_read(client, key, job_id, store) + hgets(store)
    thread, answers = in_thread(lambda: get(client, key, job_id, "respond-async, wait=20; x=1"))
    wait_until(lambda: held(store, before))
    finish(store, job_id)
    thread.join(20)
    (answer,) = answers
    assert (answer.status_code, answer.json["state"], len(answer.json["outputs"])) == (200, "completed", 1)
    assert (answer.headers["preference-applied"], answer.headers["vary"]) == ("wait=20", "Prefer")


def test_a_wait_that_ends_first_answers_the_current_state(client, tenant) -> None:
    key = tenant()
    job_id = post(client, key, "one").json["id"]
    answer = get(client, key, job_id, 'WAIT="1"')
    assert (answer.status_code, answer.json["state"], answer.headers["preference-applied"]) == (200, "queued", "wait=1")
    capped = post(client, key, "one", "wait=0")
    assert (capped.status_code, capped.json["state"], capped.headers["preference-applied"]) == (202, "queued", "wait=0")


def test_a_post_and_its_replay_wait(client, tenant, store: Store) -> None:
    key = tenant()
    first = post(client, key, "one", "wait=1")
    assert (first.status_code, first.json["state"], first.headers["preference-applied"]) == (202, "queued", "wait=1")
    thread, answers = in_thread(lambda: post(client, key, "one", "wait"))
    finish(store, first.json["id"])
    thread.join(20)
    (replay,) = answers
    assert (replay.status_code, replay.json["id"], replay.json["state"]) == (200, first.json["id"], "completed")
    assert (replay.headers["preference-applied"], replay.headers["idempotent-replayed"]) == ("wait=60", "true")
    assert len(client.simulate_get("/v1/jobs", headers=auth(key)).json["jobs"]) == 1


@pytest.mark.parametrize("prefer", ["wait=abc", "wait=-1", "wait=1.5", "wait=", "return=minimal"])
def test_a_bad_preference_is_ignored_and_changes_nothing(client, tenant, store: Store, prefer: str) -> None:
    key = tenant()
    job_id = post(client, key, "one").json["id"]
    answer = get(client, key, job_id, prefer)
    assert (answer.status_code, answer.json["state"], "preference-applied" in answer.headers) == (200, "queued", False)
    again = post(client, key, "two", prefer)
    assert (again.status_code, again.json["state"], "preference-applied" in again.headers) == (202, "queued", False)
    assert len(client.simulate_get("/v1/jobs", headers=auth(key)).json["jobs"]) == 2


def test_no_more_requests_are_held_than_the_stream_slots(settings, store: Store, tenant) -> None:
    client = testing.TestClient(create_app(dataclasses.replace(settings, sse_max_streams=1), store=store,
                                           publish=lambda job_id, priority: None))
    key = tenant()
    job_id = post(client, key, "one").json["id"]
    before = plain_read(client, key, job_id, store) + hgets(store)
    thread, answers = in_thread(lambda: get(client, key, job_id, "wait=20"))
    wait_until(lambda: held(store, before))
    refused = get(client, key, job_id, "wait=20")  # the one slot is held: answered at once, not applied
    assert (refused.status_code, refused.json["state"], "preference-applied" in refused.headers) == (200, "queued", False)
    stream = client.simulate_get(f"/v1/jobs/{job_id}/events/stream", headers=auth(key))
    assert (stream.status_code, stream.json["type"]) == (503, "urn:reckon:problem:too-many-streams")
    finish(store, job_id, "failed")
    thread.join(20)
    assert (answers[0].json["state"], answers[0].headers["preference-applied"]) == ("failed", "wait=20")
    assert get(client, key, job_id, "wait=20").headers["preference-applied"] == "wait=20"  # terminal: no slot
