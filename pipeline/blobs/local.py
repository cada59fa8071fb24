"""Blobs in a local directory (``<root>/<aa>/<bb>/<sha256>``), the default store.

Hosts that share no disk use an S3-compatible bucket instead (pipeline/blobs/s3.py), chosen by
``RECKON_BLOB_URL=s3://bucket/prefix``. Either way a put is durable before it returns, a read
checks the bytes against their sha256, and no error names a location (an output's location stays
out of logs and responses).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pipeline.blobs.base import BlobUnwritable, is_blob_name, layout, verified
from pipeline.errors import BlobMissing, BlobUnreadable


class GroupSync:
    """Group commit on one filesystem: ``sync`` returns once a ``syncfs(2)`` that began after the call
    has finished, so every write its caller made before calling is durable (data, names, new
    directories). One syncfs serves every caller that arrived while the one before it ran: with many
    writers each pays for a fraction of one, where an fsync of each file and of its directory cost
    every job two journal commits (on this machine ~1.3 ms of kernel CPU a job)."""

    def __init__(self, path: Path, syncfs: Callable[[Path], None] | None = None) -> None:
        self.path, self._syncfs = path, syncfs or _syncfs
        self._cond = threading.Condition()
        self._asked = self._done = 0
        self._syncing = False

    @property
    def asked(self) -> int:
        """How many calls of ``sync`` have begun so far."""
        with self._cond:
            return self._asked

    def sync(self) -> None:
        with self._cond:
            self._asked += 1
            ticket = self._asked
            while self._done < ticket:
                if self._syncing:  # the running sync may have begun before our writes: wait for the next
                    self._cond.wait()
                    continue
                self._syncing, covered = True, self._asked
                self._cond.release()
                try:
                    self._syncfs(self.path)
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()  # on an error a waiter syncs again
                self._done = covered


class BlobStore:
    """Blobs in a local directory: one file per sha256, its bytes durable before its name appears."""

    def __init__(self, root: str | Path, *, sync: str = "group") -> None:
        """``sync``: ``group`` (shared syncfs) or ``file`` (fsync of each file and directory)."""
        self.root = Path(root)
        self._synced = GroupSync(self.root) if sync == "group" else None

    def path(self, digest: str) -> Path:
        return self.root / layout(digest)

    def put(self, data: bytes) -> str:
        """Store ``data`` durably and return its sha256: a temp file renamed to its name, then one sync
        (``group``) that makes bytes and name durable together; with ``file``, the file's fsync before the
        rename and its directories' after.

        One sync, not one before the rename and one after (half a put's time, ~1.7 ms of an idle job):
        a crash between the rename and the sync may leave the name with lost bytes, but nothing records
        a blob before ``put`` returns, and a name found here is trusted only once its bytes are read and
        match (else written again), so such a file is never recorded; unrecorded, ``collect`` removes it."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        try:
            if target.exists() and (self._synced is None or self._holds(target, digest)):
                os.utime(target)  # written again now: ``collect`` must not take it before it is recorded
                self._durable(target.parent)  # its name (and bytes) may be a concurrent put's, not yet durable
                return digest
            self._write(target, data)
        except OSError as exc:
            raise BlobUnwritable(f"output bytes cannot be stored ({type(exc).__name__})") from None
        return digest

    @staticmethod
    def _holds(target: Path, digest: str) -> bool:
        """Whether the file already named ``digest`` holds those bytes (a crash may have lost them)."""
        try:
            return hashlib.sha256(target.read_bytes()).hexdigest() == digest
        except FileNotFoundError:
            return False

    def _write(self, target: Path, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        except FileNotFoundError:  # the first blob under this prefix (its directories go with the next sync)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                if self._synced is None:  # fsync: the bytes before the name appears
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._durable(target.parent)  # the name, any directory made for it (and, with a syncfs, the bytes)

    def _durable(self, written: Path) -> None:
        """Make durable the entries of a directory and its parents (a syncfs: everything written before)."""
        if self._synced is not None:
            self._synced.sync()
            return
        for made in (written, written.parent, self.root, self.root.parent):
            _fsync_dir(made)

    def collect(self, keep: Iterable[str], *, min_age_s: float, now: float | None = None) -> tuple[int, int]:
        """Delete every stored blob not in ``keep`` and older than ``min_age_s`` (a blob just
        written may not be recorded on its job yet); returns (removed, kept). Other files (a put's
        temporary file, anything else) are neither counted nor touched."""
        keep = set(keep)
        cutoff = (time.time() if now is None else now) - min_age_s
        removed = kept = 0
        for path in self.root.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*"):
            if not is_blob_name(str(path.relative_to(self.root))):
                continue
            if path.name in keep or path.stat().st_mtime > cutoff:
                kept += 1
                continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed, kept

    def read(self, digest: str) -> bytes:
        """The stored bytes, checked against ``digest``; BlobMissing or BlobUnreadable, never an
        error that names the path."""
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BlobMissing("stored output bytes are missing") from None
        except OSError as exc:
            raise BlobUnreadable(f"stored output bytes cannot be read ({type(exc).__name__})") from None
        return verified(data, digest)


_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(path: Path) -> None:
    """Make everything written to the filesystem holding ``path`` durable (``syncfs(2)``; where the C
    library has none, ``sync(2)``: every filesystem)."""
    syncfs = getattr(_libc, "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
