"""A job's inputs put on its server before its prompt (pipeline/work/staging.py), against the simulated
ComfyUI over real HTTP and a real redis-server."""

from __future__ import annotations

import time

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed, InvalidInput, ProviderAuthFailed
from pipeline.providers import sim as simulated
from pipeline.providers.null import NullProvider
from pipeline.providers.sim.comfy import png
from pipeline.work import actors
from pipeline.work.broker import Publisher
from pipeline.work.executor import Executor
from pipeline.work.staging import MAX_GIVEN_BACK
from pipeline.work.sweeper import Sweeper
from tests.inputs import upload
from tests.pipeline.conftest import single


def invert(*names: str) -> dict:
    """LoadImage of each name -> SaveImage: a graph reading the job's inputs."""
    graph: dict = {}
    for n, name in enumerate(names):
        graph[str(10 + n)] = {"class_type": "LoadImage", "inputs": {"image": name}}
    graph["9"] = {"class_type": "SaveImage", "inputs": {"images": ["10", 0], "filename_prefix": "staged"}}
    return graph


def put(store, settings, seed: str) -> tuple[bytes, str]:
    """An input of tenant acme, as ``POST /v1/inputs`` leaves it; (bytes, its name)."""
    data = png(seed, 16)
    return data, upload(store, settings, data)


def inputs(server: simulated.SimServer) -> dict[str, bytes]:
    with server.sim.cond:
        return dict(server.sim.inputs)


def charges(server: simulated.SimServer) -> list[dict]:
    with server.sim.cond:
        return list(server.sim.charges)


def sweep(store, settings, ahead: float) -> dict:
    return Sweeper(store, Publisher(actors.broker), settings, clock=lambda: time.time() + ahead).sweep_once()


def given_back_then_run(store, settings, admit, executor, workflow: dict, sim) -> str:
    """Admit ``workflow``; its first attempt is given back unsent and uncharged, the retry runs; the job id."""
    job_id = admit(workflow=workflow)
    assert executor.run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["submitted"], job["settled"]) == (
        "retry_wait", "input_not_staged", "0", "0")
    assert charges(sim) == [] and sim.sim.queue() == {"queue_running": [], "queue_pending": []}
    assert sweep(store, settings, ahead=2)["retries_promoted"] == 1
    assert executor.run(job_id) is True
    return job_id


def test_an_input_is_uploaded_once_before_the_prompt_and_kept_for_the_next_job(
        store, settings, admit, make_executor, sim) -> None:
    data, name = put(store, settings, "a")
    executor = make_executor(sim)
    first = admit("k1", workflow=invert(name))
    assert executor.run(first) is True
    assert inputs(sim) == {name: data} and sim.sim.uploads == 1  # under reckon/, the bytes as stored
    second = admit("k2", workflow=invert(name))
    assert make_executor(sim).run(second) is True  # another process: it checks, the server has it
    assert sim.sim.uploads == 1
    for job_id in (first, second):
        job = store.job(job_id)
        assert (job["state"], job["attempt_count"], job["settled"]) == ("completed", "1", "10")
    assert [c["units"] for c in charges(sim)] == [10, 10]


def test_a_file_of_another_size_at_the_name_is_replaced_not_saved_beside(
        store, settings, admit, make_executor, sim) -> None:
    data, name = put(store, settings, "b")
    with sim.sim.cond:
        sim.sim.inputs[name] = data[:20]  # a truncated copy
    job_id = admit(workflow=invert(name))
    assert make_executor(sim).run(job_id) is True
    assert store.job(job_id)["state"] == "completed"
    assert inputs(sim) == {name: data}  # replaced; no "name (1).png" beside it


def test_two_inputs_each_uploaded(store, settings, admit, make_executor, sim) -> None:
    (one, a), (two, b) = put(store, settings, "c1"), put(store, settings, "c2")
    job_id = admit(workflow=invert(a, b, a))
    assert make_executor(sim).run(job_id) is True
    assert inputs(sim) == {a: one, b: two} and sim.sim.uploads == 2


def test_a_refused_upload_gives_the_attempt_back_unsent_and_uncharged(
        store, settings, admit, make_executor, sim) -> None:
    data, name = put(store, settings, "d")
    sim.sim.faults = [{"kind": "upload_error", "status": 500}]
    job_id = given_back_then_run(store, settings, admit, make_executor(sim), invert(name), sim)
    job = store.job(job_id)
    assert (job["state"], job["attempts_not_sent"], job["settled"]) == ("completed", "1", "10")
    assert [(a["state"], a["error_class"]) for a in store.attempts(job_id)] == [
        ("not_sent", "input_not_staged"), ("completed", None)]
    assert len(charges(sim)) == 1


def test_a_server_that_always_refuses_uploads_fails_the_job_after_a_few_tries(
        store, settings, admit, make_executor, sim) -> None:
    _, name = put(store, settings, "e")
    sim.sim.faults = [{"kind": "upload_error", "status": 400, "times": 100}]
    job_id = admit(workflow=invert(name))
    executor = make_executor(sim)
    for _ in range(MAX_GIVEN_BACK):
        assert executor.run(job_id) is True
        assert store.job(job_id)["state"] == "retry_wait"
        assert sweep(store, settings, ahead=2)["retries_promoted"] == 1
    assert executor.run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["settled"], job["reserved"]) == (
        "failed", "input_not_staged", "0", "0")
    assert [a["state"] for a in store.attempts(job_id)] == ["not_sent"] * MAX_GIVEN_BACK + ["failed"]
    assert charges(sim) == [] and inputs(sim) == {}
    assert store.ledger("acme")["settled"] == 0


def test_an_input_gone_from_the_blob_store_fails_the_job_uncharged(store, settings, admit, make_executor, sim) -> None:
    _, name = put(store, settings, "gone")
    BlobStore(settings.blob_dir).path(name[7:71]).unlink()  # its bytes lost from the store since the upload
    job_id = admit(workflow=invert(name))
    assert make_executor(sim).run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["settled"], job["submitted"]) == (
        "failed", "input_missing", "0", "0")
    assert charges(sim) == [] and inputs(sim) == {} and sim.sim.number == 0  # no prompt reached it


def test_an_input_that_vanished_before_the_prompt_is_uploaded_again_not_failed(
        store, settings, admit, make_executor, sim) -> None:
    data, name = put(store, settings, "f")
    sim.sim.faults = [{"kind": "lose_inputs"}]  # its input folder emptied after the check
    job_id = given_back_then_run(store, settings, admit, make_executor(sim), invert(name), sim)
    job = store.job(job_id)
    assert (job["state"], job["settled"]) == ("completed", "10")
    assert sim.sim.uploads == 2 and inputs(sim) == {name: data} and len(charges(sim)) == 1


def test_a_refusal_with_every_input_present_stands(store, settings, admit, make_executor) -> None:
    """A graph the server refuses for another reason fails as invalid input, though it names an input."""
    server = simulated.start(nodes=["LoadImage"])  # SaveImage unknown to it: refused whatever the inputs
    try:
        _, name = put(store, settings, "g")
        job_id = admit(workflow=invert(name))
        with pytest.raises(AttemptFailed) as failed:
            make_executor(server).run(job_id)
        assert type(failed.value.cause) is InvalidInput and failed.value.cause.reason == "invalid_prompt"
        assert server.sim.uploads == 1 and server.sim.number == 0
    finally:
        server.close()


def test_a_job_with_inputs_costs_the_redis_commands_of_one_without(
        store, settings, admit, make_executor, sim, redis_client) -> None:
    """The check is the memory: staging sends no Redis command, uploading or not (a long lease: no renewal)."""
    executor = make_executor(sim, lease_seconds=60.0)
    data, held = put(store, settings, "i1")
    with sim.sim.cond:
        sim.sim.inputs[held] = data
    _, new = put(store, settings, "i2")

    def commands(job_id: str) -> int:
        before = sum(v["calls"] for v in redis_client.info("commandstats").values())
        assert executor.run(job_id) is True
        return sum(v["calls"] for v in redis_client.info("commandstats").values()) - before - 1  # its own INFO

    graph = {"9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "p"}}}
    commands(admit("warm", workflow=graph))  # a process's first job loads what later ones reuse
    plain = commands(admit("k0", workflow=graph))
    assert commands(admit("k1", workflow=invert(held))) == plain
    assert commands(admit("k2", workflow=invert(new))) == plain
    assert sim.sim.uploads == 1 and len(charges(sim)) == 4


def test_a_check_the_server_fails_is_the_servers_fault_not_the_jobs(store, settings, admit, make_executor, sim) -> None:
    """A 5xx to the check: the server is marked and the attempt given back; a 401: its credentials."""
    _, name = put(store, settings, "j")
    sim.sim.faults = [{"kind": "read_error", "path": "/view", "status": 503}]
    job_id = admit(workflow=invert(name))
    assert make_executor(sim).run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["attempts_not_sent"]) == ("retry_wait", "provider_http_503", "1")
    assert store.provider_block("sim") == "provider_unreachable"
    store.clear_provider("sim")
    assert sweep(store, settings, ahead=2)["retries_promoted"] == 1
    sim.sim.faults = [{"kind": "read_error", "path": "/view", "status": 401}]
    with pytest.raises(AttemptFailed) as failed:
        make_executor(sim).run(job_id)
    assert type(failed.value.cause) is ProviderAuthFailed and inputs(sim) == {} and charges(sim) == []


def test_the_null_provider_keeps_what_it_was_given(store, settings, admit) -> None:
    provider = NullProvider()
    executor = Executor(store, single(provider), BlobStore(settings.blob_dir), settings)
    data, name = put(store, settings, "k")
    filename = name.removeprefix("reckon/")
    assert provider.input_size(filename) is None
    for key in ("k1", "k2"):
        assert executor.run(admit(key, workflow=invert(name))) is True
    assert provider.input_size(filename) == len(data)
