"""Every kind of output ComfyUI saves, through the whole stack against the real ComfyUI: animated
WEBP, MP4 from SaveVideo, FLAC, MP3 and Opus from the SaveAudio nodes, PNG; each stored cleaned of
the workflow ComfyUI writes into it (a canary planted in the graph is in ComfyUI's files, and in no
stored blob)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import av
import orjson
import pytest

from pipeline.blobs.local import BlobStore
from pipeline.inputs import SUBFOLDER
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import empty, save
from tests.comfyui.test_end_to_end import ended, executions, stack  # noqa: F401 - the stack fixture

#: Frames of the tiny videos and animations: 64x64 EmptyImages.
FRAMES = 3


@pytest.fixture
def wav(comfyui: RealComfyUI, settings) -> Iterator[str]:
    """A quarter second of noise as a WAV in the blob store (as ``POST /v1/inputs`` leaves it: the
    worker reads an input from there) and in ComfyUI's input folder, under reckon's subfolder, named
    as an upload is (``reckon/<sha256>.wav``); removed from the folder after the test."""
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        frame = av.AudioFrame(format="s16", layout="mono", samples=2000)
        frame.planes[0].update(os.urandom(frame.planes[0].buffer_size))  # distinct bytes: a name of its own
        frame.sample_rate, frame.pts = 8000, 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = out.getvalue()
    BlobStore(settings.blob_dir).put(data)
    name = f"{SUBFOLDER}/{hashlib.sha256(data).hexdigest()}.wav"
    path = comfyui.directory / "ComfyUI" / "input" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    try:
        yield name
    finally:
        path.unlink(missing_ok=True)


def frames(comfyui: RealComfyUI, **inputs: Any) -> dict[str, dict[str, Any]]:
    """Node ``1``: FRAMES 64x64 images of distinct colours (identical frames would be merged into
    one by the WEBP encoder), batched by ImageBatch nodes from EmptyImage nodes ``f0``, ``f1``..."""
    nodes = {f"f{i}": empty(comfyui.color() * 40_000 % 0xFFFFFF, size=64, **inputs) for i in range(FRAMES)}
    batch = "f0"
    for i in range(1, FRAMES):
        name = "1" if i == FRAMES - 1 else f"b{i}"
        nodes[name] = {"class_type": "ImageBatch", "inputs": {"image1": [batch, 0], "image2": [f"f{i}", 0]}}
        batch = name
    return nodes


def webp(source: str, prefix: str) -> dict[str, Any]:
    return save(source, prefix, "SaveAnimatedWEBP", fps=6.0, lossless=False, quality=80, method="default")


def video(source: str, prefix: str) -> dict[str, dict[str, Any]]:
    """CreateVideo then SaveVideo (MP4, H.264): two nodes, ids ``<source>1`` and ``<source>2``."""
    return {f"{source}1": {"class_type": "CreateVideo", "inputs": {"images": [source, 0], "fps": 6.0}},
            f"{source}2": {"class_type": "SaveVideo", "inputs": {"video": [f"{source}1", 0], "filename_prefix": prefix,
                                                                  "format": "mp4", "codec": "h264"}}}


def audio(node: str, source: str, prefix: str, **inputs: Any) -> dict[str, Any]:
    return {"class_type": node, "inputs": {"audio": [source, 0], "filename_prefix": prefix, **inputs}}


def load_audio(name: str) -> dict[str, Any]:
    return {"class_type": "LoadAudio", "inputs": {"audio": name}}


def stored(store, settings, job_id: str) -> list[tuple[str, bytes]]:
    """(content type, bytes) of every stored output, by index."""
    outputs, blobs = store.outputs(job_id), BlobStore(settings.blob_dir)
    return [(outputs[i]["content_type"], blobs.read(outputs[i]["sha256"])) for i in sorted(outputs)]


def decoded_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def webp_frames(data: bytes) -> int:
    """ANMF chunks of a WEBP (FFmpeg does not decode animated WEBP: its chunks are counted)."""
    count, offset = 0, 12
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset + 4:offset + 8], "little")
        count += data[offset:offset + 4] == b"ANMF"
        offset += 8 + size + (size & 1)
    return count


def test_an_animated_webp_is_one_image_webp_output(store, settings, admit, stack, comfyui) -> None:
    prefix = f"kinds-webp-{comfyui.color()}"
    job_id = admit(workflow={**frames(comfyui), "2": webp("1", prefix)}, outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["settled"]) == ("completed", "10")
    [(kind, data)] = stored(store, settings, job_id)
    assert kind == "image/webp" and webp_frames(data) == FRAMES and b"EXIF" not in data  # animated, no metadata
    [written] = comfyui.files(prefix)
    assert b"EXIF" in written.read_bytes()  # ComfyUI wrote the prompt there: the check can fail


def test_savevideo_makes_one_mp4_output_that_decodes(store, settings, admit, stack, comfyui) -> None:
    prefix = f"kinds-mp4-{comfyui.color()}"
    job_id = admit(workflow={**frames(comfyui), **video("1", prefix)}, outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["settled"]) == ("completed", "10")
    [(kind, data)] = stored(store, settings, job_id)
    assert kind == "video/mp4" and decoded_frames(data) == FRAMES
    [written] = comfyui.files(prefix)
    with av.open(written) as container:  # ComfyUI's own file carries the prompt in its tags
        assert "prompt" in container.metadata
    with av.open(io.BytesIO(data)) as container:
        assert "prompt" not in container.metadata and container.streams.video[0].codec_context.name == "h264"


def test_a_wav_through_loadaudio_and_saveaudio_is_one_flac_output(store, settings, admit, stack, comfyui,
                                                                    wav) -> None:
    prefix = f"kinds-flac-{comfyui.color()}"
    job_id = admit(workflow={"1": load_audio(wav), "2": audio("SaveAudio", "1", prefix)}, outputs=1)
    job = ended(store, job_id)
    assert (job["state"], job["settled"]) == ("completed", "10")
    [(kind, data)] = stored(store, settings, job_id)
    assert kind == "audio/flac" and data.startswith(b"fLaC")
    with av.open(io.BytesIO(data)) as container:
        assert not container.metadata and sum(frame.samples for frame in container.decode(audio=0)) == 2000


def test_no_stored_output_of_any_kind_carries_the_canary_or_the_workflow(store, settings, admit, stack, comfyui,
                                                                         wav) -> None:
    """One graph saving every kind, a canary in every filename_prefix and in an extra node input."""
    canary = f"canary-{os.urandom(6).hex()}"
    workflow = {
        **frames(comfyui, note=canary),  # an input EmptyImage does not have: kept in the prompt
        "2": webp("1", f"{canary}-webp"),
        **video("1", f"{canary}-mp4"),  # nodes 11 and 12
        "3": load_audio(wav),
        "4": audio("SaveAudio", "3", f"{canary}-flac"),
        "5": save("1", f"{canary}-png"),
        "6": audio("SaveAudioMP3", "3", f"{canary}-mp3", quality="128k"),
        "7": audio("SaveAudioOpus", "3", f"{canary}-opus", quality="64k"),
    }
    job_id = admit(workflow=workflow, outputs=6 + FRAMES - 1)  # node 5 saves one PNG per frame
    job = ended(store, job_id)
    assert (job["state"], job["settled"], job["attempt_count"]) == ("completed", "80", "1")
    assert executions(comfyui, job_id, store) == 1
    outputs = stored(store, settings, job_id)
    assert [kind for kind, _ in outputs] == [  # node id, then list, then position
        "image/webp", "audio/flac", "image/png", "image/png", "image/png", "audio/mpeg", "audio/ogg", "video/mp4"]
    written = [path.read_bytes() for path in comfyui.files(canary)]
    assert len(written) == 8 and all(canary.encode() in data for data in written)  # ComfyUI's files carry it
    prompts = [json.dumps(workflow).encode(), orjson.dumps(workflow)]
    for _, data in outputs:
        assert canary.encode() not in data and b"class_type" not in data
        assert not any(prompt in data for prompt in prompts)
    assert decoded_frames(outputs[-1][1]) == FRAMES and webp_frames(outputs[0][1]) == FRAMES

