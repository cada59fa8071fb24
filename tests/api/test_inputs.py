"""POST /v1/inputs, GET and DELETE /v1/inputs/{sha256}: typed by their bytes, bounded in size and per
tenant, scoped to the tenant, kept while an unfinished job uses them; and admission of jobs naming them."""

from __future__ import annotations

import dataclasses
import hashlib
import io

import pytest
from falcon import testing

from api.app import create_app
from api.inputs import read_upload
from pipeline.blobs.local import BlobStore
from pipeline.state.inputs import Input, InputStore
from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import set_limits

from .conftest import auth, job_body

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # 1032 bytes; only the magic matters here
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg bytes" * 10
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 40
P = "urn:reckon:problem:"


def upload(client: testing.TestClient, key: str, data: bytes, content_type: str = "application/octet-stream",
           **kw) -> testing.Result:
    kw.setdefault("headers", {**auth(key), "Content-Type": content_type})
    return client.simulate_post("/v1/inputs", body=data, **kw)


def loads(name: str) -> dict:
    """A LoadImage -> SaveImage workflow taking ``name``."""
    return {"1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}


def test_an_upload_is_stored_then_recorded_and_the_same_bytes_again_answer_the_same(
        client, tenant, settings) -> None:
    key = tenant()
    sha = hashlib.sha256(PNG).hexdigest()
    first = upload(client, key, PNG, "image/png")
    assert first.status_code == 201 and first.headers["Location"] == f"/v1/inputs/{sha}"
    assert first.json == {"name": f"reckon/{sha}.png", "sha256": sha, "bytes": len(PNG), "content_type": "image/png"}
    assert BlobStore(settings.blob_dir).read(sha) == PNG
    again = upload(client, key, PNG)  # octet-stream: the bytes say what it is
    assert (again.status_code, again.json) == (200, first.json)
    got = client.simulate_get(f"/v1/inputs/{sha}", headers=auth(key))
    assert (got.status_code, got.json) == (200, first.json)
    BlobStore(settings.blob_dir).path(sha).unlink()  # as if collected between a read and a record
    assert upload(client, key, PNG).status_code == 200 and BlobStore(settings.blob_dir).read(sha) == PNG


def test_another_tenants_input_is_not_found_and_cannot_be_deleted(client, tenant) -> None:
    mine, theirs = tenant("acme"), tenant("other")
    sha = upload(client, mine, PNG).json["sha256"]
    for method in (client.simulate_get, client.simulate_delete):
        resp = method(f"/v1/inputs/{sha}", headers=auth(theirs))
        assert (resp.status_code, resp.json["type"]) == (404, P + "input-not-found")
    assert client.simulate_get(f"/v1/inputs/{sha}", headers=auth(mine)).status_code == 200
    bad = client.simulate_get("/v1/inputs/not-a-digest", headers=auth(mine))
    assert (bad.status_code, bad.json["type"]) == (404, P + "input-not-found")


@pytest.mark.parametrize(("data", "declared", "status", "problem"), [
    (b"plain text, no image", "application/octet-stream", 415, "input-type-unsupported"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml", 415, "input-type-unsupported"),
    (PNG, "image/jpeg", 415, "input-type-unsupported"),  # contradicts the declared type
    (WAV, "video/mp4", 415, "input-type-unsupported"),
    (b"", "image/png", 400, "input-empty"),
])
def test_bytes_no_loader_reads_or_that_contradict_their_type_are_refused_and_nothing_stored(
        client, tenant, settings, store, data, declared, status, problem) -> None:
    key = tenant()
    resp = upload(client, key, data, declared)
    assert (resp.status_code, resp.json["type"]) == (status, P + problem)
    assert store.redis.hgetall(TenantKeys("acme").inputs) == {}
    assert not any(p.is_file() for p in (BlobStore(settings.blob_dir).root.rglob("*")))


def test_a_type_spelled_otherwise_is_the_type_its_bytes_are(client, tenant) -> None:
    key = tenant()
    assert upload(client, key, JPEG, "image/jpg").json["content_type"] == "image/jpeg"
    wav = upload(client, key, WAV, "audio/x-wav; charset=binary").json
    assert (wav["content_type"], wav["name"].rsplit(".", 1)[1]) == ("audio/wav", "wav")


def test_an_input_over_the_size_limit_is_413_before_its_body_is_read(settings, store, tenant) -> None:
    client = testing.TestClient(create_app(dataclasses.replace(settings, input_max_bytes=1000), store=store))
    key = tenant()
    resp = upload(client, key, PNG)  # 1032 bytes
    assert (resp.status_code, resp.json["type"], resp.json["limit"]) == (413, P + "input-too-large", 1000)
    assert upload(client, key, PNG[:1000]).status_code == 201
    huge = upload(client, key, PNG[:10], headers={**auth(key), "Content-Type": "image/png",
                                                  "Content-Length": str(10**15)})
    assert (huge.status_code, huge.json["type"]) == (413, P + "input-too-large")


class Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def test_a_chunked_body_is_cut_at_the_limit_and_a_huge_content_length_is_refused_unread() -> None:
    from falcon import Request

    from api.problems import Problem

    body = Counting(b"\x89PNG\r\n\x1a\n" + b"x" * (5 << 20))
    env = testing.create_environ("/v1/inputs", method="POST")
    env.pop("CONTENT_LENGTH", None)
    env |= {"wsgi.input": body, "wsgi.input_terminated": True}
    with pytest.raises(Problem) as refused:
        read_upload(Request(env), 2 << 20)
    assert refused.value.problem == "input-too-large" and body.taken == (2 << 20) + 1
    huge = Counting(b"x")
    env = testing.create_environ("/v1/inputs", method="POST", headers={"Content-Length": str(10**15)})
    env["wsgi.input"] = huge
    with pytest.raises(Problem):
        read_upload(Request(env), 1000)
    assert huge.taken == 0


def test_the_quota_refuses_with_507_writing_no_blob_and_an_operator_override_lifts_it(
        settings, store, tenant, redis_client) -> None:
    client = testing.TestClient(create_app(dataclasses.replace(settings, input_quota_bytes=2500), store=store))
    key = tenant()
    first, second = PNG, PNG + b"2"
    assert upload(client, key, first).status_code == 201
    assert upload(client, key, second).status_code == 201
    third = PNG + b"33"
    resp = upload(client, key, third)
    assert (resp.status_code, resp.json["type"]) == (507, P + "input-quota-exceeded")
    assert (resp.json["held"], resp.json["quota"], resp.json["bytes"]) == (2065, 2500, 1034)
    assert not BlobStore(settings.blob_dir).path(hashlib.sha256(third).hexdigest()).exists()
    assert upload(client, key, first).status_code == 200  # one it has already is no new byte
    set_limits(redis_client, "acme", input_quota=4000)
    assert upload(client, key, third).status_code == 201
    assert store.redis.hget(TenantKeys("acme").inputs, "total") == str(2065 + 1034)


def test_the_number_of_inputs_is_bounded_too_whatever_their_size(settings, store, tenant) -> None:
    """Each input costs Redis about 800 bytes and the blob store a file: within a quota of bytes alone, 9-byte
    inputs by the hundred million would pass (1 GiB / 9 bytes)."""
    client = testing.TestClient(create_app(dataclasses.replace(settings, input_max_count=2), store=store))
    key = tenant()
    tiny = [b"\x89PNG\r\n\x1a\n" + bytes([n]) for n in range(3)]  # 9 bytes each
    assert [upload(client, key, data).status_code for data in tiny[:2]] == [201, 201]
    resp = upload(client, key, tiny[2])
    assert (resp.status_code, resp.json["type"], resp.json["inputs"], resp.json["max_inputs"]) == \
        (507, P + "input-quota-exceeded", 2, 2)
    assert not BlobStore(settings.blob_dir).path(hashlib.sha256(tiny[2]).hexdigest()).exists()
    assert upload(client, key, tiny[0]).status_code == 200  # one it has already is no new input
    with pytest.raises(Exception) as over:  # the step checks again: two uploads at once cannot both pass
        InputStore(store.redis, store.scripts).put("acme", Input(f"reckon/{'0' * 64}.png", "0" * 64, 9, "image/png"),
                                                  default_quota=10**9, max_inputs=2)
    assert (type(over.value).__name__, over.value.inputs) == ("OverQuota", 2)
    gone = client.simulate_delete(f"/v1/inputs/{hashlib.sha256(tiny[0]).hexdigest()}", headers=auth(key))
    assert gone.status_code == 204
    assert upload(client, key, tiny[2]).status_code == 201
    assert store.redis.hlen(TenantKeys("acme").inputs) == 3  # two inputs and `total`


def test_a_job_naming_its_tenants_input_lists_it_and_one_naming_any_other_is_422_writing_nothing(
        client, submit, tenant, store) -> None:
    mine, theirs = tenant("acme"), tenant("other")
    name = upload(client, mine, PNG).json["name"]
    sha = name.split("/")[1].split(".")[0]
    job = submit(mine, "k1", body=job_body(workflow=loads(name)))
    assert (job.status_code, job.json["inputs"]) == (202, [{"sha256": sha}])
    assert "inputs" not in submit(mine, "k0").json  # none named: the view as before inputs existed
    view = client.simulate_get(f"/v1/jobs/{job.json['id']}", headers=auth(mine)).json
    assert view["inputs"] == [{"sha256": sha}] and sha not in str(view["outputs"])
    refused = {
        "another tenant's input": (theirs, name, "input-unknown"),
        "never uploaded": (mine, f"reckon/{'0' * 64}.png", "input-unknown"),
        "its own, under another extension": (mine, name.replace(".png", ".jpg"), "input-unknown"),
        "an operator's file": (mine, "example.png", "input-not-allowed"),
        "another job's output": (mine, "ComfyUI_00001_.png [output]", "input-not-allowed"),
    }
    for case, (key, named, problem) in refused.items():
        resp = submit(key, "k2", body=job_body(workflow=loads(named)))
        assert (resp.status_code, resp.json["type"], resp.json["names"]) == (422, P + problem, [named]), case
    for who in ("acme", "other"):  # the first job only: nothing reserved, no job, no index entry for the others
        assert store.redis.zcard(TenantKeys(who).jobs) == (2 if who == "acme" else 0)
    assert store.ledger("other")["reserved"] == 0
    assert store.redis.smembers(TenantKeys("acme").input_jobs(sha)) == {job.json["id"]}


def test_another_tenants_input_by_any_other_route_comfyui_reads_is_422_writing_nothing(
        client, submit, tenant, store) -> None:
    """An object's member (Load3D reads the names in its ``image`` object), the subfolder whole, another
    spelling of the path, a name computed by another node, a node that reads the output folder: none reaches
    another tenant's bytes."""
    mine, theirs = tenant("acme"), tenant("other")
    name = upload(client, mine, PNG).json["name"]
    routes = {
        "in an object": ({"1": {"class_type": "SomeCustomLoader", "inputs": {"files": {"image": [name]}}}},
                         "input-unknown", [name]),
        "Load3D's object": ({"1": {"class_type": "Load3D", "inputs": {
            "model_file": "3d/x.glb", "image": {"image": name, "mask": name, "normal": name, "lineart": name,
                                                 "recording": "", "camera_info": {}}, "width": 64, "height": 64}}},
            "input-not-allowed", ["3d/x.glb", "Load3D.image not a file's name"]),
        "another job's output": ({"1": {"class_type": "LoadImageOutput",
                                        "inputs": {"image": "ComfyUI_00001_.png [output]"}}},
                                 "input-not-allowed", ["ComfyUI_00001_.png [output]"]),
        "the folder": ({"1": {"class_type": "LoadImageSetFromFolderNode",
                              "inputs": {"folder": "reckon", "resize_method": "None"}}},
                       "input-not-allowed", ["reckon"]),
        "annotated": (loads(f"{name} [input]"), "input-not-allowed", [f"{name} [input]"]),
        "computed": ({"1": {"class_type": "StringConcatenate",
                            "inputs": {"string_a": "reck", "string_b": name[4:], "delimiter": ""}},
                      "2": {"class_type": "LoadImage", "inputs": {"image": ["1", 0]}}},
                     "input-not-allowed", ["LoadImage.image linked to another node's output"]),
    }
    for case, (workflow, problem, names) in routes.items():
        resp = submit(theirs, "k1", body=job_body(workflow=workflow))
        assert (resp.status_code, resp.json["type"], resp.json["names"]) == (422, P + problem, names), case
    assert store.redis.zcard(TenantKeys("other").jobs) == 0 and store.ledger("other")["reserved"] == 0


def test_the_fingerprint_covers_the_inputs_a_job_names(client, submit, tenant) -> None:
    key = tenant()
    one, two = upload(client, key, PNG).json["name"], upload(client, key, JPEG).json["name"]
    assert submit(key, "same", body=job_body(workflow=loads(one))).status_code == 202
    replay = submit(key, "same", body=job_body(workflow=loads(one)))
    assert (replay.status_code, replay.headers.get("Idempotent-Replayed")) == (202, "true")
    other = submit(key, "same", body=job_body(workflow=loads(two)))
    assert (other.status_code, other.json["type"]) == (422, P + "idempotency-key-reused")


def test_delete_waits_for_every_unfinished_job_that_names_the_input(client, submit, tenant) -> None:
    key = tenant()
    name = upload(client, key, PNG).json["name"]
    sha = name.split("/")[1].split(".")[0]
    jobs = [submit(key, f"k{n}", body=job_body(workflow=loads(name))).json["id"] for n in range(2)]
    busy = client.simulate_delete(f"/v1/inputs/{sha}", headers=auth(key))
    assert (busy.status_code, busy.json["type"], sorted(busy.json["jobs"])) == (409, P + "input-in-use", sorted(jobs))
    client.simulate_post(f"/v1/jobs/{jobs[0]}/cancel", headers=auth(key))
    finished = client.simulate_get(f"/v1/jobs/{jobs[0]}", headers=auth(key)).json  # packed into one key by now
    assert (finished["state"], finished["inputs"]) == ("cancelled", [{"sha256": sha}])
    busy = client.simulate_delete(f"/v1/inputs/{sha}", headers=auth(key))
    assert (busy.status_code, busy.json["jobs"]) == (409, [jobs[1]])
    client.simulate_post(f"/v1/jobs/{jobs[1]}/cancel", headers=auth(key))
    assert client.simulate_delete(f"/v1/inputs/{sha}", headers=auth(key)).status_code == 204
    assert client.simulate_get(f"/v1/inputs/{sha}", headers=auth(key)).status_code == 404
    assert client.simulate_delete(f"/v1/inputs/{sha}", headers=auth(key)).status_code == 404
    resp = submit(key, "k3", body=job_body(workflow=loads(name)))
    assert (resp.status_code, resp.json["type"]) == (422, P + "input-unknown")
    assert upload(client, key, PNG).status_code == 201  # uploaded again: a new input
