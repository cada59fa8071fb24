"""An output reckon cannot clean of metadata is never stored: the job fails for good, naming the
output by index and content type, its other outputs stored, the run paid; unless the operator
allows the content type (``RECKON_OUTPUT_UNCLEANED_TYPES``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.errors import AttemptFailed
from pipeline.fleet import Server
from pipeline.providers import sim as simulated
from pipeline.providers.base import OperationStatus, OutputRef
from pipeline.providers.fleet import Fleet
from pipeline.settings import Settings
from pipeline.state.jobs import job_view
from pipeline.work.executor import Executor
from pipeline.work.routing import Router

GLB = b"glTF\x02\x00\x00\x00" + b'{"prompt": "canary-glb"}'


class Mixed:
    """Completes every prompt with a PNG, a binary glTF (saved by a 3D node) and a PNG."""

    name, price_per_output, client_id = "comfyui", 10, "reckon"

    def submit(self, operation_id, workflow, indices, *, front=False) -> None:
        return None

    def cancel(self, operation_id) -> None:
        pass

    def status(self, operation_id) -> OperationStatus:
        refs = [OutputRef(0, "a.png"), OutputRef(1, "mesh.glb", content_type="model/gltf-binary"),
                OutputRef(2, "b.png")]
        return OperationStatus("completed", refs, produced=3)

    def fetch(self, ref: OutputRef) -> bytes:
        return GLB if ref.filename.endswith(".glb") else simulated.png(ref.filename)

    def epoch(self) -> str:
        return ""

    def offers(self) -> None:
        return None


def executor(store, settings: Settings, **options) -> Executor:
    fleet = Fleet([Server("a", "http://a", 2)], lambda _: Mixed())
    return Executor(store, fleet, BlobStore(settings.blob_dir), dataclasses.replace(settings, **options))


def stored_bytes(settings: Settings) -> list[bytes]:
    return [path.read_bytes() for path in Path(settings.blob_dir).rglob("*") if path.is_file()]


def test_an_output_reckon_cannot_clean_fails_the_job_for_good_and_is_never_stored(store, settings, admit) -> None:
    job_id = admit(outputs=3)
    with pytest.raises(AttemptFailed) as failure:
        executor(store, settings).run(job_id)
    assert Router(store, settings, rng=lambda: 1.0).route(failure.value) == "dead_letter"  # not retried
    job = store.job(job_id)
    assert (job["state"], job["error_class"], job["error_reason"], job["attempt_count"]) == (
        "failed", "execution_failed", "output_not_cleanable", "1")
    assert job["settled"] == "30" and store.ledger("acme")["reserved"] == 0  # it ran: paid whole, once
    outputs = store.outputs(job_id)
    assert sorted(outputs) == [0, 2] and {o["content_type"] for o in outputs.values()} == {"image/png"}
    detail = job_view(job, outputs)["error"]["detail"]
    assert (detail["output_index"], detail["content_type"], detail["output_indices"]) == (
        "1", "model/gltf-binary", "1")
    assert "mesh" not in str(detail) and all(b"canary-glb" not in data for data in stored_bytes(settings))


def test_the_operator_may_allow_a_content_type_stored_as_it_came(store, settings, admit) -> None:
    job_id = admit(outputs=3)
    assert executor(store, settings, output_uncleaned_types=frozenset({"model/gltf-binary"})).run(job_id) is True
    job = store.job(job_id)
    assert (job["state"], job["settled"]) == ("completed", "30")
    glb = store.outputs(job_id)[1]
    assert glb["content_type"] == "model/gltf-binary" and BlobStore(settings.blob_dir).read(glb["sha256"]) == GLB


def test_the_setting_is_a_comma_separated_list_of_content_types() -> None:
    settings = Settings.from_env({"RECKON_OUTPUT_UNCLEANED_TYPES": " model/gltf-binary, Image/SVG+xml ,"})
    assert settings.output_uncleaned_types == frozenset({"model/gltf-binary", "image/svg+xml"})
    assert Settings.from_env({}).output_uncleaned_types == frozenset()
    with pytest.raises(ValueError, match="not a content type"):
        Settings.from_env({"RECKON_OUTPUT_UNCLEANED_TYPES": "gltf"})
