"""The blob store's contract, run against both backends: the local directory and an S3-compatible
server (moto's, a real process speaking HTTP on loopback)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from pipeline.blobs import Blobs, open_blobs
from pipeline.blobs.base import BlobUnwritable
from pipeline.blobs.local import BlobStore, GroupSync
from pipeline.blobs.s3 import S3BlobStore
from pipeline.errors import BlobMissing, BlobUnreadable
from pipeline.operate import cli
from pipeline.settings import Settings
from tests.conftest import free_port, wait_until
from tests.s3server import CREDENTIALS, S3Server, client, running

IMAGE = b"\x89PNG\r\n\x1a\n an output"
DIGEST = hashlib.sha256(IMAGE).hexdigest()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running(tmp_path_factory.mktemp("moto")) as server:
        yield server


@dataclasses.dataclass
class Backend:
    """A store, and what a test does to it behind the store's back."""

    blobs: Blobs
    prefix: str  # where the store's names start: "" in its directory, "out/" in its bucket
    stored: Callable[[], list[str]]  # the names of everything stored, blobs or not
    place: Callable[[str, bytes], None]  # write bytes under a name, as a fault or another writer would
    broken: Blobs  # the same kind of store, failing every operation (a lost disk, an unreachable service)
    secrets: tuple[str, ...]  # what no error may show: the directory, the bucket

    def name(self, digest: str) -> str:
        return f"{self.prefix}{digest[:2]}/{digest[2:4]}/{digest}"


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        root = tmp_path / "blobs"
        (tmp_path / "a-file").write_text("")

        def place_file(name: str, data: bytes) -> None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)

        def files() -> list[str]:
            return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())

        return Backend(BlobStore(root), "", files, place_file, BlobStore(tmp_path / "a-file" / "blobs"),
                       (str(tmp_path),))
    server: S3Server = request.getfixturevalue("s3")
    bucket, s3 = server.bucket(), server.client()

    def place_object(name: str, data: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=name, Body=data)

    nobody = client(f"http://127.0.0.1:{free_port()}", connect_timeout=1, retries={"max_attempts": 1})
    return Backend(S3BlobStore(s3, bucket, "out/"), "out/", lambda: server.keys(bucket), place_object,
                   S3BlobStore(nobody, bucket, "out"), (bucket, "out/"))


def test_put_returns_the_sha256_and_read_gives_the_bytes_back(backend: Backend) -> None:
    assert backend.blobs.put(IMAGE) == DIGEST
    assert backend.blobs.put(IMAGE) == DIGEST  # the same bytes again: one blob
    assert backend.blobs.put(b"") == hashlib.sha256(b"").hexdigest()
    assert backend.blobs.read(DIGEST) == IMAGE
    assert backend.blobs.read(hashlib.sha256(b"").hexdigest()) == b""
    assert backend.stored() == sorted([backend.name(DIGEST), backend.name(hashlib.sha256(b"").hexdigest())])


def test_a_blob_never_stored_is_missing_and_a_name_that_is_no_digest_is_refused(backend: Backend) -> None:
    with pytest.raises(BlobMissing, match="^stored output bytes are missing$"):
        backend.blobs.read(DIGEST)
    for name in ("../../etc/passwd", DIGEST.upper(), DIGEST[:-1]):
        with pytest.raises(ValueError, match="not a sha256 digest"):
            backend.blobs.read(name)


def test_other_bytes_under_a_digest_are_unreadable_not_served(backend: Backend) -> None:
    backend.blobs.put(IMAGE)
    backend.place(backend.name(DIGEST), IMAGE + b"x")  # bit rot, a torn copy, another writer
    with pytest.raises(BlobUnreadable, match="^stored output bytes do not match their sha256$"):
        backend.blobs.read(DIGEST)


def test_collect_deletes_only_old_blobs_nobody_keeps(backend: Backend) -> None:
    held, orphan, other = (backend.blobs.put(data) for data in (IMAGE, b"orphan", b"other orphan"))
    backend.place(f"{backend.prefix}aa/bb/notes.txt", b"not a blob, never collected")
    assert backend.blobs.collect({held}, min_age_s=3600) == (0, 3)  # all just written
    assert backend.blobs.collect({held}, min_age_s=3600, now=time.time() + 3601) == (2, 1)
    assert backend.blobs.read(held) == IMAGE
    for gone in (orphan, other):
        with pytest.raises(BlobMissing):
            backend.blobs.read(gone)
    assert backend.stored() == sorted([backend.name(held), f"{backend.prefix}aa/bb/notes.txt"])
    assert backend.blobs.collect(set(), min_age_s=0, now=time.time() + 1) == (1, 0)


def test_a_failing_store_raises_errors_that_name_no_location(backend: Backend) -> None:
    with pytest.raises(BlobUnwritable) as unwritable:
        backend.broken.put(IMAGE)
    with pytest.raises(BlobUnreadable) as unreadable:
        backend.broken.read(DIGEST)
    for error in (unwritable.value, unreadable.value):
        assert error.__cause__ is None and error.__suppress_context__
        for secret in (*backend.secrets, DIGEST[:12]):
            assert secret not in str(error)
    kind = "NotADirectoryError" if isinstance(backend.broken, BlobStore) else "EndpointConnectionError"
    assert str(unwritable.value) == f"output bytes cannot be stored ({kind})"
    assert str(unreadable.value) == f"stored output bytes cannot be read ({kind})"


def test_s3_put_stores_the_sha256_checksum_with_the_object(s3: S3Server) -> None:
    bucket = s3.bucket()
    S3BlobStore(s3.client(), bucket, "/deep/prefix/").put(IMAGE)
    key = f"deep/prefix/{DIGEST[:2]}/{DIGEST[2:4]}/{DIGEST}"
    head = s3.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    checksum = base64.b64encode(bytes.fromhex(DIGEST)).decode()
    assert (head["ContentLength"], head["ChecksumSHA256"]) == (len(IMAGE), checksum)


def test_s3_without_its_bucket_is_unavailable_not_missing(s3: S3Server) -> None:
    blobs = S3BlobStore(s3.client(), "reckon-no-such-bucket")
    with pytest.raises(BlobUnreadable, match=r"^stored output bytes cannot be read \(NoSuchBucket\)$"):
        blobs.read(DIGEST)  # an API answer of 503 (try again), not 410 (gone for good)
    with pytest.raises(BlobUnwritable, match=r"^output bytes cannot be stored \(NoSuchBucket\)$"):
        blobs.put(IMAGE)


def test_settings_choose_the_store(settings, s3: S3Server, monkeypatch) -> None:
    local = open_blobs(settings)
    assert isinstance(local, BlobStore) and local.root == Path(settings.blob_dir)
    chosen = open_blobs(dataclasses.replace(settings, blob_url="s3://reckon-out/tenant-outputs",
                                            s3_endpoint=s3.endpoint))
    assert isinstance(chosen, S3BlobStore)
    assert (chosen.bucket, chosen.prefix, chosen.client.meta.endpoint_url) == (
        "reckon-out", "tenant-outputs/", s3.endpoint)
    assert isinstance(open_blobs(dataclasses.replace(settings, blob_url="s3://reckon-out")), S3BlobStore)
    for url in ("s3://", "gs://reckon-out/x", "s3://reckon-out/x?region=eu", "/var/blobs"):
        with pytest.raises(ValueError, match="^RECKON_BLOB_URL must be s3://BUCKET"):
            open_blobs(dataclasses.replace(settings, blob_url=url))
    with pytest.raises(ValueError, match="holds credentials") as refused:
        open_blobs(dataclasses.replace(settings, blob_url="s3://AKID:hunter2@reckon-out"))
    assert "hunter2" not in str(refused.value)


def test_no_credential_or_location_reaches_a_log_even_at_debug(settings, s3: S3Server, monkeypatch,
                                                                caplog) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = s3.bucket()
    with caplog.at_level(logging.DEBUG):
        blobs = open_blobs(dataclasses.replace(settings, blob_url=f"s3://{bucket}/p", s3_endpoint=s3.endpoint))
        assert blobs.read(blobs.put(IMAGE)) == IMAGE
        with pytest.raises(BlobMissing):
            blobs.read(hashlib.sha256(b"never").hexdigest())
        assert blobs.collect(set(), min_age_s=3600) == (0, 1)
    for secret in (CREDENTIALS["AWS_SECRET_ACCESS_KEY"], CREDENTIALS["AWS_ACCESS_KEY_ID"], bucket, DIGEST[:12]):
        assert secret not in caplog.text
    assert s3.keys(bucket) == [f"p/{DIGEST[:2]}/{DIGEST[2:4]}/{DIGEST}"]


def test_reckon_blobs_gc_collects_from_the_bucket_the_settings_name(store, s3: S3Server, monkeypatch,
                                                                    capsys, tmp_path) -> None:
    bucket = s3.bucket()
    for name, value in {**CREDENTIALS, "RECKON_BLOB_URL": f"s3://{bucket}", "RECKON_S3_ENDPOINT": s3.endpoint,
                        "RECKON_BLOB_DIR": str(tmp_path / "unused")}.items():
        monkeypatch.setenv(name, value)
    S3BlobStore(s3.client(), bucket).put(b"orphan, just written")
    assert cli.main(["blobs", "gc"], store=store) == 0
    assert orjson.loads(capsys.readouterr().out) == {"removed": 0, "kept": 1, "referenced": 0}
    assert not (tmp_path / "unused").exists()


def test_s3_put_fails_when_the_service_does_not_hold_what_was_sent(s3: S3Server) -> None:
    bucket, s3_client = s3.bucket(), s3.client()

    def other_bytes(parsed: dict, **_: object) -> None:  # what a service that stored other bytes answers
        parsed["ChecksumSHA256"] = base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode()

    s3_client.meta.events.register("after-call.s3.HeadObject", other_bytes)
    with pytest.raises(BlobUnwritable, match=r"^output bytes cannot be stored \(the service holds other bytes\)$"):
        S3BlobStore(s3_client, bucket).put(IMAGE)


def test_a_local_blob_written_again_is_young_again(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    digest = blobs.put(IMAGE)
    hour_ago = time.time() - 3601
    os.utime(blobs.path(digest), (hour_ago, hour_ago))
    assert blobs.put(IMAGE) == digest  # a new job made the same bytes and will record them
    assert blobs.collect(set(), min_age_s=3600) == (0, 1)


def test_s3_gc_keeps_a_blob_written_again_while_it_lists(s3: S3Server) -> None:
    """An old blob nobody held is written again by a new job (the same bytes) and recorded while gc is
    listing, after gc read what jobs hold: gc looks at it again before deleting, and it stays."""
    bucket = s3.bucket()
    worker, gc = S3BlobStore(s3.client(), bucket, "out"), S3BlobStore(s3.client(), bucket, "out")
    digest = worker.put(IMAGE)
    time.sleep(2.1)  # older than the collect's minimum age below

    def written_again(**_: object) -> None:
        assert worker.put(IMAGE) == digest

    gc.client.meta.events.register("after-call.s3.ListObjectsV2", written_again)  # a real put, timed
    assert gc.collect(set(), min_age_s=2) == (0, 1)
    assert worker.read(digest) == IMAGE


def test_s3_gc_that_fails_names_no_bucket(store, s3: S3Server, monkeypatch, capsys) -> None:
    blobs = S3BlobStore(s3.client(), "reckon-no-such-bucket", "tenant-x")
    with pytest.raises(BlobUnreadable, match=r"^stored outputs cannot be listed or removed \(NoSuchBucket\)$"):
        blobs.collect(set(), min_age_s=0)
    monkeypatch.setenv("RECKON_BLOB_URL", "s3://reckon-no-such-bucket/tenant-x")
    monkeypatch.setenv("RECKON_S3_ENDPOINT", s3.endpoint)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["blobs", "gc"], store=store) == 1
    err = capsys.readouterr().err
    assert err == "reckon: stored outputs cannot be listed or removed (NoSuchBucket)\n"


def test_one_filesystem_sync_serves_every_writer_that_waited_for_it(tmp_path: Path) -> None:
    first_running, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def syncfs(path: Path) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            first_running.set()
            assert release.wait(10)

    synced = GroupSync(tmp_path, syncfs)
    leader = threading.Thread(target=synced.sync)
    leader.start()
    assert first_running.wait(10)
    followers = [threading.Thread(target=synced.sync) for _ in range(5)]
    for follower in followers:
        follower.start()
    wait_until(lambda: synced.asked == 6)  # they wait: the running sync began before their writes
    assert calls == [0] and all(f.is_alive() for f in followers)
    release.set()
    for thread in [leader, *followers]:
        thread.join(10)
    assert calls == [0, 1]  # one more sync, for all five


def test_a_failed_sync_fails_its_caller_and_the_next_caller_syncs_again(tmp_path: Path) -> None:
    results = iter([OSError(5, "Input/output error"), None])

    def syncfs(path: Path) -> None:
        result = next(results)
        if result:
            raise result

    synced = GroupSync(tmp_path, syncfs)
    with pytest.raises(OSError):
        synced.sync()
    synced.sync()  # succeeds: a sync that began after this call
    with pytest.raises(StopIteration):
        next(results)


def test_the_real_filesystem_sync_runs(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    digest = blobs.put(b"durable bytes")
    assert blobs.read(digest) == b"durable bytes"
    assert sorted(p.name for p in blobs.path(digest).parent.iterdir()) == [digest]  # no temporary file left


def test_file_by_file_sync_stores_the_same(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs", sync="file")  # RECKON_BLOB_SYNC=file
    digest = blobs.put(b"durable bytes, one fsync at a time")
    assert blobs.read(digest) == b"durable bytes, one fsync at a time"
    assert sorted(p.name for p in blobs.path(digest).parent.iterdir()) == [digest]
    assert open_blobs(Settings.from_env({"RECKON_BLOB_DIR": str(tmp_path), "RECKON_BLOB_SYNC": "file"}))._synced is None
    with pytest.raises(ValueError):
        Settings.from_env({"RECKON_BLOB_SYNC": "sometimes"})


def test_a_put_of_bytes_already_stored_makes_their_name_durable_too(tmp_path: Path) -> None:
    """Their name may be a concurrent put's, renamed but not synced yet, or one a crash left unsynced."""
    syncs: list[Path] = []
    blobs = BlobStore(tmp_path / "blobs")
    blobs._synced = GroupSync(blobs.root, syncs.append)
    digest = blobs.put(b"the same bytes")
    assert len(syncs) == 1  # the bytes and the name, together
    assert blobs.put(b"the same bytes") == digest
    assert len(syncs) == 2  # the name again, though nothing was written


@pytest.mark.parametrize("lost", [b"", b"\0" * 14, b"the same byte"])
def test_a_name_whose_bytes_a_crash_lost_is_written_again_not_trusted(tmp_path: Path, lost: bytes) -> None:
    """One sync makes bytes and name durable together: a crash between the rename and the sync may leave
    the name with its bytes lost (empty, zeros, cut short). The next put of those bytes reads what the
    name holds and writes them again, so the blob it returns (and the job records) reads back whole."""
    syncs: list[Path] = []
    blobs = BlobStore(tmp_path / "blobs")
    blobs._synced = GroupSync(blobs.root, syncs.append)
    digest = blobs.put(b"the same bytes")
    blobs.path(digest).write_bytes(lost)  # what the disk held after the crash
    with pytest.raises(BlobUnreadable):
        blobs.read(digest)
    assert blobs.put(b"the same bytes") == digest
    assert blobs.read(digest) == b"the same bytes"
    assert len(syncs) == 2
    assert sorted(p.name for p in blobs.path(digest).parent.iterdir()) == [digest]  # no temporary file left
