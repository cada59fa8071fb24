"""A worker SIGKILLed in the middle of an upload to the real ComfyUI (the ``body_partly_sent`` fault
point: the first 64 KiB of the multipart body sent, the rest not), with real processes (gunicorn,
Dramatiq, watcher, sweeper): ComfyUI keeps no part of the file, and the job completes, charged once."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.providers.http import CHUNK
from tests.comfyui.conftest import RealComfyUI
from tests.comfyui.test_adapter import save
from tests.comfyui.test_end_to_end import executions
from tests.conftest import wait_until
from tests.faults.conftest import Stack
from tests.faults.test_crashes import finished, setup
from tests.faults.test_staging_crash import killed_at
from tests.inputs import upload


def noise_png(size: int) -> bytes:
    """An RGB PNG of random pixels: ``size`` x ``size``, stored (not compressed): more than one block."""
    rows = b"".join(b"\x00" + os.urandom(3 * size) for _ in range(size))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b"")


@pytest.fixture
def processes(redis_client, tmp_path: Path, comfyui: RealComfyUI) -> Iterator[Stack]:
    running = Stack(tmp_path, RECKON_PROVIDER_URL=comfyui.url)
    try:
        yield running
    finally:
        running.stop(graceful=False)


def test_a_worker_killed_mid_upload_leaves_no_file_and_its_job_completes_charged_once(
        processes: Stack, redis_client, store, settings, comfyui: RealComfyUI) -> None:
    auth = setup(processes, redis_client)
    data = noise_png(256)
    assert len(data) > 2 * CHUNK
    name = upload(store, settings, data, blob_dir=processes.env["RECKON_BLOB_DIR"])
    on_server = comfyui.directory / "ComfyUI" / "input" / name
    workflow = {"1": {"class_type": "LoadImage", "inputs": {"image": name}},
                "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
                "9": save("2", f"cut-{comfyui.color()}")}
    try:
        job_id = killed_at(processes, auth, workflow, "body_partly_sent")  # 64 KiB of the body at ComfyUI
        assert not on_server.exists() and store.job(job_id)["submitted"] == "0"
        processes.start_worker()
        wait_until(lambda: finished(store, job_id), timeout=60)
        job = store.job(job_id)
        assert (job["state"], job["settled"]) == ("completed", "10")
        assert [(a["state"], a["error_class"]) for a in store.attempts(job_id)] == [
            ("failed", "not_executed"), ("completed", None)]
        assert on_server.read_bytes() == data  # the whole file, sent again by the next attempt
        assert executions(comfyui, job_id, store) == 1
        assert store.ledger("acme")["settled"] == 10
    finally:
        on_server.unlink(missing_ok=True)  # the folder is shared by every ComfyUI here
