"""Admission's promises: supersedes is part of the admission, a replay is the first response byte for
byte, admission times come from Redis, one failing tenant holds up no other."""

from __future__ import annotations

import pytest
import redis

from pipeline.errors import InvalidRequest
from pipeline.state.jobs import first_response
from pipeline.state.keys import TenantKeys
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_tenant
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.sweeper import Sweeper
from tests.pipeline.conftest import WORKFLOW
from tests.pipeline.test_failures import attempt, balanced, inject
from tests.pipeline.test_promises import sweeper

BOTH_BACKENDS = True


def test_supersedes_is_part_of_the_admission(store, settings, tenant) -> None:
    tenant()
    sent: list[str] = []
    admitter = Admitter(store, lambda job_id, priority: sent.append(job_id), settings)
    body = {"kind": "image", "workflow": WORKFLOW, "outputs": 1}
    older = admitter.submit("acme", "k1", body).job_id
    with pytest.raises(InvalidRequest):
        admitter.submit("acme", "k2", body | {"supersedes": "acme.0123456789abcdef0123"})
    windows, _ = TenantKeys("acme").idempotency_windows(None, 24 * 3600)
    assert not any(store.redis.hexists(w, "k2") for w in windows)  # nothing was written
    assert store.redis.zcard(TenantKeys("acme").jobs) == 1
    newer = admitter.submit("acme", "k3", body | {"supersedes": older}).job_id
    job = store.job(older)
    assert (job["state"], job["external_effect"]) == ("cancelled", "none")
    assert [e["reason"] for e in store.events(older)] == ["admitted", "superseded"]
    assert store.job(newer)["supersedes"] == older
    assert balanced(store) == {"allowance": 10_000, "reserved": 30, "uncertain": 0, "settled": 0, "available": 9_970}


def test_a_dispatched_job_is_only_marked_obsolete_when_superseded(store, settings, admit, make_executor) -> None:
    older = admit()
    claim = store.claim(older, worker="w", lease_ms=60_000, operation_id="op", servers={"sim": 1000})
    assert claim is not None
    newer = admit("intent-2", supersedes=older)
    assert store.job(older)["state"] == "running" and store.job(older)["obsolete"] == "1"
    assert store.job(newer)["state"] == "queued"


def test_one_tenant_whose_visit_fails_does_not_hold_up_the_others(store, settings, tenant, monkeypatch) -> None:
    for name in ("aaa", "bbb"):
        create_tenant(store.redis, name, 1_000)
        job_id = Admitter(store, lambda *_: None, settings).submit(name, "k", {"kind": "image", "workflow": WORKFLOW,
                                                                              "outputs": 1}).job_id
        assert store.claim(job_id, worker="w", lease_ms=1_000, operation_id="op", servers={"sim": 1000}) is not None
    visit = Sweeper._visit

    def failing(self, t, *args):
        if t.name == "aaa":
            raise redis.ResponseError("this tenant's visit fails")
        return visit(self, t, *args)

    monkeypatch.setattr(Sweeper, "_visit", failing)
    assert sweeper(store, settings, ahead=5).sweep_once()["leases_expired"] == 1  # bbb's, in the same pass


def test_a_replay_is_the_first_response_byte_for_byte_whatever_happened_since(store, settings, tenant,
                                                                              make_executor, make_router, sim) -> None:
    tenant()
    admitter = Admitter(store, Publisher(actors.broker), settings)
    body = {"kind": "image", "workflow": WORKFLOW, "outputs": 2, "deadline_s": 600}
    first = admitter.submit("acme", "k", body)
    inject(sim, {"kind": "policy"})
    assert attempt(make_executor(sim), make_router(), first.job_id) == "dead_letter"
    store.replay(first.job_id)  # a new deadline and a new reservation for the replayed run
    assert attempt(make_executor(sim), make_router(), first.job_id) == "done"
    again = admitter.submit("acme", "k", body)
    assert (again.replayed, again.body) == (True, first.body)
    assert store.job(first.job_id)["state"] == "completed"


def test_admission_times_come_from_redis_and_match_the_first_response(store, settings, tenant) -> None:
    tenant()
    submitted = Admitter(store, lambda *_: None, settings).submit(
        "acme", "k", {"kind": "image", "workflow": WORKFLOW, "outputs": 1, "deadline_s": 90})
    job = store.job(submitted.job_id)
    created = int(job["created_at"])
    assert abs(created - store.server_ms()) < 2_000
    assert (int(job["deadline"]), job["updated_at"]) == (created + 90_000, str(created))
    assert submitted.body == first_response(job)  # the 202 shows exactly what was stamped
