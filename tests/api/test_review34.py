"""Issue 34 reviewed as an attacker: each test reproduces a promise that did not hold (docs/api.md
"Batches", "Waiting for the result"), against a real redis-server."""

from __future__ import annotations

import time

from falcon import testing

from api.app import create_app, open_admitter
from api.prefer import wait_seconds
from pipeline.state import batches
from pipeline.state.batching import BatchAdmitter
from pipeline.state.jobs import fingerprint
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.store import Store
from pipeline.state.workflows import SHARED

from .conftest import auth, job_body
from .test_batches import mixed, offer_all, post
from .test_workflows import GRAPH, PARAMS, shared  # noqa: F401 (a fixture)

#: Each test here runs against one redis-server and against a Redis Cluster (tests/conftest.py).
BOTH_BACKENDS = True


def test_a_batch_retried_while_the_first_request_runs_leaves_no_job_outside_its_record(settings, tenant,
                                                                                         store: Store) -> None:
    """Request A admits the batch (item 4 over the allowance: refused) and has not written its record yet;
    the allowance is topped up; the client's retry B admits item 4 as a job; A writes its record first, so
    B's HSETNX keeps A's (item 4 refused). B's job for item 4 must not stay reserved and queued: the
    batch's GET, its cancel and its answer never show it, yet the tenant pays for it."""
    key = tenant(allowance=70)
    offer_all(store)
    bodies = mixed()
    ttl_ms = max(settings.retention_seconds, settings.idempotency_ttl_seconds) * 1000
    # A: the claim and the admission of the real BatchAdmitter, paused before its record
    a_claim = batches.claim(store.redis, "acme", "b-race", batches.batch_fingerprint([fingerprint(b) for b in bodies]),
                            ttl_s=settings.idempotency_ttl_seconds)
    a_outcomes = BatchAdmitter(open_admitter(settings, store, lambda *_: None)).admit("acme", "b-race", bodies)
    a_results = [o.submitted.job_id if o.submitted else {"type": type(o.refused).__name__} for o in a_outcomes]
    assert [isinstance(r, str) for r in a_results] == [True, False, False, True, False]
    store.redis.hincrby(TenantKeys("acme").ledger, "allowance", 1000)  # item 4 fits now

    def a_records_first(job_id: str, _priority: str) -> None:  # B's publish: after B's admission, before its record
        batches.record(store.redis, "acme", a_claim.batch_id, a_results, ttl_ms=ttl_ms)

    b = post(testing.TestClient(create_app(settings, store=store, publish=a_records_first)), key, "b-race", bodies)
    assert b.status_code == 202 and "problem" in b.json["items"][4]  # the record kept is A's
    kept = [item for item in batches.items(store.redis, "acme", a_claim.batch_id) if isinstance(item, str)]
    live = [j for j in store.redis.zrange(TenantKeys("acme").jobs, 0, -1)
            if store.redis.hget(JobKeys(j).record, "state") != "cancelled"]
    assert sorted(live) == sorted(kept)
    assert store.ledger("acme")["reserved"] == 30 * len(kept)


def _parse_seconds(header: str) -> float:
    """The least of 5 parses' times (s): a pause of the shared machine does not make one slow."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        wait_seconds(header)
        times.append(time.perf_counter() - start)
    return min(times)


def test_a_hostile_prefer_header_costs_what_a_plain_one_of_its_length_does() -> None:
    """A Prefer header of 8 KB (gunicorn's limit for one line; several lines are joined into one list)
    whose elements make the parser backtrack (a name followed by thousands of spaces, or unclosed quoted
    strings) took 0.4-0.9 s of the web process's CPU each, holding the GIL: a few such requests a second
    starve every request of the process. Measured as a ratio against a plain header of the same length, in
    one run."""
    plain = _parse_seconds("a" * 8000)
    for hostile in ("wait" + " " * 8000 + "x", '"\\' * 4000):
        assert _parse_seconds(hostile) < 50 * plain + 0.001, hostile[:8]
    assert wait_seconds("respond-async, wait=5") == 5  # what a client sends still counts


def test_a_batch_retried_after_a_crash_and_a_new_version_answers_the_jobs_its_keys_made(client, tenant, store,
                                                                                        shared, settings) -> None:
    """A batch naming ``portrait`` (the latest) is admitted and its process dies before the record
    (``batch_after_admit``); the operator saves ``portrait`` version 2; the client retries the same batch
    under the same key. The batch's claim matches (the bodies are the same text), so its items are admitted
    again; each item's key holds a job of version 1, whose fingerprint names ``portrait@1``: each item answers
    that job (it was refused ``idempotency-key-reused`` and recorded so, for good, while its job ran and was
    charged)."""
    key = tenant()
    bodies = [{"kind": "image", "workflow_ref": "portrait", "params": {"prompt": f"p{i}"}, "outputs": 1}
              for i in range(2)]
    batches.claim(store.redis, "acme", "b-v", batches.batch_fingerprint([fingerprint(b) for b in bodies]),
                  ttl_s=settings.idempotency_ttl_seconds)  # the first request: its claim, its admission, no record
    BatchAdmitter(open_admitter(settings, store, lambda *_: None)).admit("acme", "b-v", bodies)
    shared.save(SHARED, "portrait", {**GRAPH, "3": {**GRAPH["3"], "inputs": {**GRAPH["3"]["inputs"], "steps": 30}}},
                PARAMS)
    again = post(client, key, "b-v", bodies)
    made = store.redis.zrange(TenantKeys("acme").jobs, 0, -1)
    assert again.status_code == 202 and len(made) == 2
    assert [item.get("problem", {}).get("type") for item in again.json["items"]] == [None, None]
    assert {item["job"]["id"] for item in again.json["items"]} == set(made)
