"""The operator's ``reckon`` command against a real redis-server."""

from __future__ import annotations

import orjson
from falcon import testing

from api.app import create_app
from pipeline.operate import cli
from pipeline.state import keys
from pipeline.state.tenants import create_key, create_tenant, hash_key, tenant_for_key
from pipeline.work.sweeper import Sweeper

#: The one shard of these tests' deployment.
SHARD = keys.ShardKeys(0)


def run(store, capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), store=store)
    out, err = capsys.readouterr()
    return code, out, err


def test_tenant_and_key_lifecycle(store, capsys) -> None:
    code, out, _ = run(store, capsys, "tenant", "create", "acme", "--allowance", "500")
    assert code == 0 and orjson.loads(out)["available"] == 500
    assert run(store, capsys, "tenant", "create", "acme", "--allowance", "9")[0] == 1
    assert run(store, capsys, "tenant", "create", "Bad Name", "--allowance", "9")[0] == 1
    code, out, _ = run(store, capsys, "key", "create", "acme")
    api_key = out.strip()
    assert code == 0 and tenant_for_key(store.redis, api_key) == "acme"
    assert api_key not in str(store.redis.keys("*"))  # only the hash is stored
    assert run(store, capsys, "key", "create", "nobody")[0] == 1


def test_job_show_and_status_never_print_the_workflow(store, capsys, admit) -> None:
    job_id = admit(outputs=2)
    code, out, _ = run(store, capsys, "job", "show", job_id)
    shown = orjson.loads(out)
    assert code == 0 and shown["job"]["state"] == "queued" and "workflow" not in shown["job"]
    assert "KSampler" not in out
    assert [e["to"] for e in shown["events"]] == ["queued"]
    code, out, _ = run(store, capsys, "status", "--json")
    assert orjson.loads(out)["classes"]["interactive"]["depth"] == 1 and "KSampler" not in out
    assert run(store, capsys, "job", "show", "acme.nope")[0] == 1


def test_pause_drains_a_server_without_losing_work(store, settings, capsys, admit, make_executor, sim) -> None:
    job_id = admit()
    assert run(store, capsys, "provider", "pause", "sim")[0] == 0
    assert make_executor(sim).run(job_id) is False  # parked: no slot on a paused server
    job = store.job(job_id)
    assert (job["state"], job.get("attempt_count", "0")) == ("queued", "0")
    assert store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [job_id]
    published: list[tuple[str, str]] = []
    sweeper = Sweeper(store, lambda *message: published.append(message), settings)
    assert sweeper.sweep_once()["unparked"] == 0 and published == []
    code, out, _ = run(store, capsys, "provider", "clear", "sim")
    assert code == 0 and orjson.loads(out)["cleared"] is True
    assert sweeper.sweep_once()["unparked"] == 1 and published == [(job_id, "unparked")]
    assert make_executor(sim).run(job_id) is True
    assert store.job(job_id)["state"] == "completed" and len(sim.sim.charges) == 1
    status = orjson.loads(run(store, capsys, "provider", "status")[1])
    assert status["parked"] == 0 and status["servers"]["comfyui"] == {"busy": 0, "cap": 2, "stopped": {},
                                                                     "watched": 0}


def test_tenant_disable_enable_and_key_revoke(store, capsys) -> None:
    run(store, capsys, "tenant", "create", "acme", "--allowance", "500")
    first = run(store, capsys, "key", "create", "acme")[1].strip()
    second = run(store, capsys, "key", "create", "acme")[1].strip()
    code, out, _ = run(store, capsys, "tenant", "disable", "acme")
    assert (code, orjson.loads(out)) == (0, {"tenant": "acme", "disabled": True})
    assert tenant_for_key(store.redis, first) is None
    assert orjson.loads(run(store, capsys, "tenant", "show", "acme")[1])["disabled"] is True
    code, out, _ = run(store, capsys, "tenant", "enable", "acme")
    assert (code, orjson.loads(out)["disabled"], tenant_for_key(store.redis, first)) == (0, False, "acme")
    assert run(store, capsys, "tenant", "disable", "nobody")[0] == 1
    hashes = orjson.loads(run(store, capsys, "key", "list", "acme")[1])["key_hashes"]
    assert len(hashes) == 2 and first not in str(hashes)
    code, out, _ = run(store, capsys, "key", "revoke", first)
    assert (code, orjson.loads(out)) == (0, {"tenant": "acme", "revoked": True})
    assert run(store, capsys, "key", "revoke", hash_key(second))[0] == 0
    assert (tenant_for_key(store.redis, first), tenant_for_key(store.redis, second)) == (None, None)
    code, _, err = run(store, capsys, "key", "revoke", first)
    assert (code, err.strip()) == (1, "reckon: no such API key")


def test_jobs_by_state_job_events_and_tenant_show(store, capsys, admit, make_executor, sim) -> None:
    done, waiting = admit("k1"), admit("k2")
    assert make_executor(sim).run(done) is True
    code, out, _ = run(store, capsys, "jobs", "--state", "queued", "--tenant", "acme")
    assert code == 0 and [row["id"] for row in orjson.loads(out)] == [waiting]
    code, out, _ = run(store, capsys, "jobs", "--state", "completed")
    assert [(row["id"], row["tenant"]) for row in orjson.loads(out)] == [(done, "acme")]
    code, out, _ = run(store, capsys, "job", "events", done)
    assert code == 0 and [e["to"] for e in orjson.loads(out) if e["type"] == "state"] == [
        "queued", "running", "completed"]
    assert "KSampler" not in out
    code, out, _ = run(store, capsys, "job", "events", done, "--after", "2")
    assert [e["seq"] for e in orjson.loads(out)] == [3]
    assert run(store, capsys, "job", "events", "acme.nope")[0] == 1
    assert run(store, capsys, "tenant", "set", "acme", "--max-inflight", "5", "--rate", "2/s")[0] == 0
    code, out, _ = run(store, capsys, "tenant", "show", "acme")
    shown = orjson.loads(out)
    assert code == 0 and shown["jobs"] == {"completed": 1, "queued": 1}
    assert shown["limits"] == {"max_inflight": "5", "rate": "2.0", "burst": "2"} and shown["disabled"] is False
    assert shown["ledger"]["settled"] == 10
    assert run(store, capsys, "tenant", "set", "acme", "--input-quota", "5000")[0] == 0
    assert orjson.loads(run(store, capsys, "tenant", "show", "acme")[1])["limits"]["input_quota"] == "5000"
    assert run(store, capsys, "tenant", "set", "acme", "--input-quota", "0")[0] == 0  # back to the setting
    assert "input_quota" not in orjson.loads(run(store, capsys, "tenant", "show", "acme")[1])["limits"]
    assert run(store, capsys, "tenant", "show", "nobody")[0] == 1


def test_stats_rebuild_restores_the_global_figures_a_redis_from_an_older_version_lacks(
        store, capsys, admit, make_executor, sim) -> None:
    done, waiting = admit(), admit(key="k2")
    assert make_executor(sim).run(done) is True
    store.redis.delete(SHARD.stats, SHARD.queue, SHARD.due)  # as an older version left them
    code, out, _ = run(store, capsys, "stats", "audit")
    assert (code, orjson.loads(out)["problems"]) == (1, [
        "jobs interactive completed: global 0 != 1", "jobs interactive queued: global 0 != 1",
        "ledger reserved: global 0 != 30", "ledger settled: global 0 != 10", "queue index: 1 jobs differ",
        "due index: 1 jobs differ"])
    code, out, _ = run(store, capsys, "stats", "rebuild")
    assert (code, orjson.loads(out)) == (0, {"jobs": 2, "queued": 1, "unfinished": 1, "problems": []})
    assert store.redis.zrange(SHARD.queue, 0, -1) == store.redis.zrange(SHARD.due, 0, -1) == [waiting]
    assert store.purge(done, retention_ms=0) is True  # purging the old job keeps the figures whole
    assert run(store, capsys, "stats", "audit")[:2] == (0, '{\n  "problems": []\n}\n')


def test_jobs_by_state_finds_the_newest_of_that_state_past_newer_jobs_of_another(
        store, capsys, admit, make_executor, sim) -> None:
    cancelled, first, second = admit("k1"), admit("k2"), admit("k3")
    store.cancel(cancelled)  # finished first: the oldest entry of the shared `done` index
    for job_id in (first, second):
        assert make_executor(sim).run(job_id) is True
    code, out, _ = run(store, capsys, "jobs", "--state", "cancelled", "--limit", "1")
    assert (code, [row["id"] for row in orjson.loads(out)]) == (0, [cancelled])
    code, out, _ = run(store, capsys, "jobs", "--state", "completed", "--limit", "1")
    assert [row["id"] for row in orjson.loads(out)] == [second]  # the newest


def test_batch_show_counts_its_jobs_and_names_each_refusal(store, settings, capsys) -> None:
    create_tenant(store.redis, "acme", 1_000)
    headers = {"Authorization": f"Bearer {create_key(store.redis, 'acme')}", "Idempotency-Key": "nightly"}
    job = {"kind": "image", "outputs": 1, "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}}
    batch = testing.TestClient(create_app(settings, store=store, publish=lambda job_id, priority: None)).simulate_post(
        "/v1/batches", json={"jobs": [job, {"kind": "image"}]}, headers=headers).json
    code, out, _ = run(store, capsys, "batch", "show", "acme", batch["id"])
    shown = orjson.loads(out)
    assert code == 0 and (shown["size"], shown["counts"]["queued"], shown["counts"]["refused"]) == (2, 1, 1)
    assert shown["items"] == [{"index": 0, "job": batch["items"][0]["job"]["id"], "state": "queued"},
                              {"index": 1, "problem": "urn:reckon:problem:invalid-job"}]
    assert "KSampler" not in out
    assert run(store, capsys, "batch", "show", "rival", batch["id"])[0] == 1  # another tenant's: none
