"""Uploaded inputs against a real ComfyUI, through admission, a Dramatiq worker, the websocket watcher
and the sweeper: each input put on the server before its prompt (pipeline/work/staging.py).

Every test uploads a PNG of its own colour (its own sha256, so its own name under ComfyUI's shared
``input/reckon/`` folder) and removes only its own files there at the end."""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.fleet import Server
from pipeline.inputs import SUBFOLDER
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.fleet import Fleet
from pipeline.providers.http import HttpTransport
from pipeline.providers.sim.comfy import png
from pipeline.work import actors
from pipeline.work.executor import Executor
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import save
from tests.comfyui.test_end_to_end import ended, executions
from tests.inputs import upload as upload_input
from tests.pipeline.conftest import InProcess


def invert(name: str, prefix: str) -> dict[str, Any]:
    """LoadImage (the uploaded input) -> ImageInvert -> SaveImage."""
    return {"1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "9": save("2", prefix)}


def folder(comfyui: RealComfyUI) -> Path:
    return comfyui.directory / "ComfyUI" / "input" / SUBFOLDER


class Upload:
    """A 64x64 PNG of one colour uploaded by tenant acme, as ``POST /v1/inputs`` leaves it."""

    def __init__(self, store, settings, comfyui: RealComfyUI) -> None:
        self.seed = f"input-{comfyui.color()}-{threading.get_ident()}"
        self.data = png(self.seed, 64)
        self.name = upload_input(store, settings, self.data)
        self.sha256 = self.name[7:71]
        self.rgb = hashlib.sha256(self.seed.encode()).digest()[:3]  # png()'s colour

    def on_server(self, comfyui: RealComfyUI) -> list[Path]:
        """Every file of ComfyUI's ``input/reckon/`` holding this input (``<sha>.png``, ``<sha> (1).png``...)."""
        return sorted(folder(comfyui).glob(f"{self.sha256}*"))


@pytest.fixture
def upload(store, settings, admit, comfyui: RealComfyUI) -> Iterator[Any]:
    made: list[Upload] = []

    def make() -> Upload:
        made.append(Upload(store, settings, comfyui))
        return made[-1]

    yield make
    for one in made:  # only this test's own files: the folder is shared by every ComfyUI here
        for path in one.on_server(comfyui):
            path.unlink(missing_ok=True)


class RestartsAfterUpload(ComfyUI):
    """The real adapter, whose first upload is followed by a ComfyUI restart (its input folder kept, or
    this upload's file removed as a wipe would): between a job's upload and its prompt."""

    def __init__(self, comfyui: RealComfyUI, *, wipe: bool) -> None:
        super().__init__(HttpTransport(comfyui.url, timeout=10), price_per_output=10)
        self.comfyui, self.wipe, self.restarts = comfyui, wipe, 0

    def upload_input(self, filename: str, data: bytes, *, overwrite: bool = False) -> None:
        super().upload_input(filename, data, overwrite=overwrite)
        if self.restarts == 0:
            self.restarts += 1
            self.comfyui.restart()
            if self.wipe:
                (folder(self.comfyui) / filename).unlink()


def pixels(data: bytes) -> set[tuple[int, int, int]]:
    """The distinct RGB colours of an image."""
    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0)).reformat(format="rgb24")
    plane, width = frame.planes[0], frame.width
    raw = bytes(plane)
    rows = (raw[y * plane.line_size:y * plane.line_size + width * 3] for y in range(frame.height))
    return {tuple(row[x:x + 3]) for row in rows for x in range(0, width * 3, 3)}  # type: ignore[misc]


@pytest.fixture
def stack(store, settings, broker, comfyui: RealComfyUI) -> Iterator[InProcess]:
    with InProcess(store, settings, broker, {"gpu": comfyui}) as running:
        yield running


def test_an_uploaded_png_is_inverted_by_comfyui(store, settings, admit, stack, comfyui, upload) -> None:
    image = upload()
    job_id = admit(workflow=invert(image.name, f"inv-{comfyui.color()}"), outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["attempt_count"], job["settled"]) == ("completed", "1", "10")
    assert [path.read_bytes() for path in image.on_server(comfyui)] == [image.data]  # reckon/<sha256>.png
    output = store.outputs(job_id)[0]
    assert output["content_type"] == "image/png"
    inverted = pixels(BlobStore(settings.blob_dir).read(output["sha256"]))
    assert len(inverted) == 1  # one colour, as the upload
    (r, g, b), = inverted
    assert all(abs(got - (255 - sent)) <= 1 for got, sent in zip((r, g, b), image.rgb, strict=True))
    assert executions(comfyui, job_id, store) == 1


def test_two_jobs_uploading_one_input_at_once_leave_one_file(store, admit, stack, comfyui, upload) -> None:
    image = upload()
    jobs = [admit(f"k{n}", workflow=invert(image.name, f"twice-{comfyui.color()}")) for n in range(2)]
    for job_id in jobs:
        job = ended(store, job_id)
        assert (job["state"], job["settled"]) == ("completed", "10")
    assert [path.name for path in image.on_server(comfyui)] == [f"{image.sha256}.png"]
    assert image.on_server(comfyui)[0].read_bytes() == image.data


@pytest.mark.parametrize("wipe", [False, True], ids=["folder_kept", "folder_wiped"])
def test_a_restart_between_upload_and_prompt_completes_the_job_charged_once(
        store, settings, broker, admit, comfyui, upload, wipe: bool) -> None:
    image = upload()
    with InProcess(store, settings, broker, {"gpu": comfyui}) as running:
        adapter = RestartsAfterUpload(comfyui, wipe=wipe)
        fleet = Fleet([Server("gpu", comfyui.url, 2)], lambda server: adapter)
        actors.use(Executor(store, fleet, BlobStore(settings.blob_dir), running.settings))
        job_id = admit(workflow=invert(image.name, f"restart-{comfyui.color()}"), outputs=1)
        job = ended(store, job_id, timeout=90)
    assert adapter.restarts == 1
    assert (job["state"], job["settled"], store.ledger("acme")["settled"]) == ("completed", "10", 10)
    attempts = [(a["state"], a["error_class"]) for a in store.attempts(job_id)]
    # wiped: ComfyUI refused the prompt naming the vanished file; the attempt went back unsent
    assert attempts == ([("not_sent", "input_not_staged")] if wipe else []) + [("completed", None)]
    assert [path.read_bytes() for path in image.on_server(comfyui)] == [image.data]
    assert executions(comfyui, job_id, store) == 1
