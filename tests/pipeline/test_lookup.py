"""One job as an operator looks it up (pipeline/state/lookup.py): exactly the fields named, from live
keys or a packed record alike, never the workflow, an output's sha256 or the error's detail, in a
fixed number of commands; on one Redis and on a Cluster (one MULTI, one hash tag)."""

from __future__ import annotations

from collections import Counter

import orjson

from pipeline.state import lookup, progress
from pipeline.state.jobs import iso
from pipeline.state.keys import JobKeys
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant
from tests.replication import RedisProcs

BOTH_BACKENDS = True
NOW = 1_700_000_000_000
JOB = "acme.00000000000000000001"
CANARY = "CANARY-lookup-5b2e71"
#: An output's sha256 (the name of its blob), distinctive so that a test sees it is never shown.
SHA = "feedc0de" * 8


def admit(store: Store, outputs: int = 2) -> None:
    create_tenant(store.redis, "acme", 1_000)
    workflow = orjson.dumps({"3": {"class_type": "KSampler", "inputs": {"text": CANARY}}})
    record = {"id": JOB, "tenant": "acme", "state": "queued", "kind": "image", "priority": "batch",
              "outputs_requested": str(outputs), "ceiling": "60", "price": "10", "reserved": "60", "charged": "0",
              "uncertain": "0", "settled": "0", "attempt_count": "0", "lease_gen": "0",
              "per_attempt": str(10 * outputs),
              "deadline_s": "600", "attempts_allowed": "3", "deadline": str(NOW + 600_000), "created_at": str(NOW),
              "updated_at": str(NOW), "idem_key": f"idem-{CANARY}"}
    store.admit("acme", f"idem-{CANARY}", JOB, fingerprint="fp", ceiling=60, fields=record, workflow=workflow,
                status=202, now_ms=NOW, idem_ttl_s=60, outbox_delay_ms=10_000)


def run_first_attempt(store: Store):
    held = store.claim(JOB, worker="w1", now_ms=NOW + 1_000, lease_ms=30_000, operation_id="op-1",
                       servers={"sim": 2})
    assert held is not None
    assert progress.record(store.scripts, JOB, 1, "op-1", "3", 4, 20, now_ms=NOW + 1_500)
    store.mark_submit(held, epoch="e1", lease_ms=30_000, now_ms=NOW + 2_000)
    store.store_output(held, 0, {"sha256": SHA, "bytes": 1234, "content_type": "image/png"}, now_ms=NOW + 3_000)
    return held


def test_a_running_job_shows_exactly_the_named_fields(store) -> None:
    admit(store)
    run_first_attempt(store)
    assert lookup.job(store.redis, JOB) == {
        "id": JOB, "tenant": "acme", "state": "running", "kind": "image", "priority": "batch",
        "outputs_requested": 2, "attempt_count": 1, "attempts_listed": 1, "attempts_allowed": 3,
        "cancel_requested": False, "obsolete": False, "external_effect": None, "supersedes": None,
        "deadline": iso(NOW + 600_000), "created_at": iso(NOW), "updated_at": iso(NOW + 3_000), "settled_at": None,
        "error": None, "next": {"what": "lease_expires", "at": iso(NOW + 32_000)}, "parked": False,
        "cost": {"price": 10, "per_attempt": 20, "ceiling": 60, "reserved": 60, "charged": 0, "uncertain": 0,
                 "settled": 0},
        "outputs": [{"index": 0, "bytes": 1234, "content_type": "image/png"}],
        "attempts": [{"number": 1, "state": "running", "server": "sim", "provider": "comfyui", "worker": "w1",
                      "generation": 1, "price": 10, "operation_id": "op-1", "started_at": iso(NOW + 1_000),
                      "submitted_at": iso(NOW + 2_000), "ended_at": None, "error_class": None}],
        "events": [
            {"seq": 1, "type": "state", "at": iso(NOW), "from": None, "to": "queued", "reason": "admitted"},
            {"seq": 2, "type": "state", "at": iso(NOW + 1_000), "from": "queued", "to": "running", "reason": "claimed"},
            {"seq": 3, "type": "progress", "at": iso(NOW + 1_500), "attempt": 1, "node": "3", "value": 4, "max": 20},
        ],
    }
    shown = orjson.dumps(lookup.job(store.redis, JOB)).decode()
    assert CANARY not in shown and SHA not in shown and "idem" not in shown
    assert CANARY in store.redis.get(JobKeys(JOB).workflow)  # the probe works: the workflow is there


def test_waiting_states_say_what_comes_next_and_a_failure_never_its_detail(store) -> None:
    admit(store)
    held = run_first_attempt(store)
    store.retry(held, delay_ms=5_000, error_class="transient", now_ms=NOW + 4_000)
    job = lookup.job(store.redis, JOB)
    assert (job["state"], job["next"], job["attempts"][0]["state"], job["attempts"][0]["error_class"]) == (
        "retry_wait", {"what": "runs_again", "at": iso(NOW + 9_000)}, "failed", "transient")
    assert store.promote(JOB, now_ms=NOW + 9_000) == "queued"
    assert store.claim(JOB, worker="w2", now_ms=NOW + 9_500, lease_ms=30_000, operation_id="op-2",
                       servers={}) is None  # no server: parked
    job = lookup.job(store.redis, JOB)
    assert (job["state"], job["next"], job["parked"]) == ("queued", None, True)
    held = store.claim(JOB, worker="w2", now_ms=NOW + 10_000, lease_ms=30_000, operation_id="op-2",
                       servers={"sim": 2})
    store.finish(held, "failed", error_class="provider_failed", reason="oom", detail={"message": CANARY},
                 now_ms=NOW + 11_000)
    job = lookup.job(store.redis, JOB)
    assert (job["state"], job["error"], job["next"], job["settled_at"]) == (
        "failed", {"class": "provider_failed", "reason": "oom"}, None, iso(NOW + 11_000))
    assert CANARY not in orjson.dumps(job).decode() and CANARY in store.redis.hget(JobKeys(JOB).record, "error_detail")


def test_a_packed_job_reads_as_it_did_live(store) -> None:
    admit(store, outputs=1)
    held = run_first_attempt(store)
    assert store.charge(held, 10) == 10
    live = lookup.job(store.redis, JOB)
    store.finish(held, "completed", now_ms=NOW + 4_000)
    assert store.redis.exists(JobKeys(JOB).attempts, JobKeys(JOB).events, JobKeys(JOB).outputs) == 0  # packed
    packed = lookup.job(store.redis, JOB)
    assert packed is not None and packed["state"] == "completed"
    assert packed["outputs"] == live["outputs"] and [e for e in packed["events"] if e["type"] == "state"][:2] == \
        [e for e in live["events"] if e["type"] == "state"]
    assert [e["to"] for e in packed["events"]] == ["queued", "running", "completed"]  # progress goes when packed
    assert packed["attempts"][0] | {"state": "running", "ended_at": None} == live["attempts"][0]
    assert packed["cost"] == {"price": 10, "per_attempt": 10, "ceiling": 60, "reserved": 0, "charged": 0,
                              "uncertain": 0, "settled": 10}
    assert lookup.job(store.redis, "acme.00000000000000000009") is None


def servers(store, request, backend) -> list:
    """A client of each Redis server: the one, or each node of the Cluster."""
    if backend == "single":
        return [store.redis]
    cluster = request.getfixturevalue("redis_cluster")
    return [RedisProcs.client(port) for port in cluster.ports]


def test_a_look_up_is_one_multi_of_a_fixed_number_of_reads(store, request, backend) -> None:
    """Counted on every server (a Cluster sends the MULTI to the one node of the job's hash tag)."""
    admit(store)
    run_first_attempt(store)
    nodes = servers(store, request, backend)
    for node in nodes:
        node.config_resetstat()
    assert lookup.job(store.redis, JOB) is not None
    calls: Counter[str] = Counter()
    for node in nodes:
        calls.update({name[len("cmdstat_"):]: v["calls"] for name, v in node.info("commandstats").items()
                      if not name.startswith("cmdstat_config")})
        if node is not store.redis:
            node.close()
    assert calls == {"multi": 1, "hmget": 1, "hgetall": 2, "lrange": 2, "zscore": 4, "exec": 1}
    assert sum(calls.values()) - 2 == lookup.COMMANDS == 9
