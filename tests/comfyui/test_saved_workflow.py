"""A saved workflow against a real ComfyUI: the colour a job's parameter sets is the colour ComfyUI painted."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

import pytest

from pipeline.blobs.local import BlobStore
from pipeline.state.submit import Admitter
from pipeline.state.workflows import SHARED, Workflows
from pipeline.work.broker import Publisher
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import empty, save
from tests.comfyui.test_end_to_end import ended
from tests.pipeline.conftest import InProcess


@pytest.fixture
def stack(store, settings, broker, comfyui: RealComfyUI) -> Iterator[InProcess]:
    with InProcess(store, settings, broker, {"gpu": comfyui}) as running:
        yield running


def first_pixel(png: bytes) -> tuple[int, int, int]:
    """The first pixel of an 8-bit RGB PNG (whatever its first row's filter: the first pixel has no neighbour)."""
    at, idat = 8, b""
    while at < len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"IDAT":
            idat += png[at + 8:at + 8 + length]
        at += 12 + length
    row = zlib.decompress(idat)
    return row[1], row[2], row[3]


def test_the_params_of_a_saved_workflow_reach_comfyui(store, settings, broker, tenant, stack, comfyui) -> None:
    tenant()
    graph = {"1": empty(0), "9": save("1", f"saved-{comfyui.color()}")}
    Workflows(store.redis, store.scripts, settings).save(SHARED, "solid", graph, {
        "color": {"node": "1", "input": "color", "type": "integer", "minimum": 0, "maximum": 0xFFFFFF,
                  "required": True}})
    admitter = Admitter(store, Publisher(broker), settings)
    colors = [comfyui.color(), comfyui.color()]
    jobs = [admitter.submit("acme", f"solid-{n}", {"kind": "image", "workflow_ref": "solid@1",
                                                   "params": {"color": color}, "outputs": 1}).job_id
            for n, color in enumerate(colors)]
    blobs = BlobStore(settings.blob_dir)
    for job_id, color in zip(jobs, colors):
        assert ended(store, job_id)["state"] == "completed"
        painted = first_pixel(blobs.read(store.outputs(job_id)[0]["sha256"]))
        assert painted == (color >> 16 & 255, color >> 8 & 255, color & 255)
