"""Durable, content-addressed output storage: ``<root>/<aa>/<bb>/<sha256>``."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from .errors import BlobMissing, BlobUnreadable


class BlobStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError("not a sha256 digest")
        return self.root / digest[:2] / digest[2:4] / digest

    def put(self, data: bytes) -> str:
        """Store ``data`` durably (temp file, fsync, rename, fsync dir); return its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(digest)
        if target.exists():
            return digest
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return digest

    def collect(self, keep: Iterable[str], *, min_age_s: float, now: float | None = None) -> tuple[int, int]:
        """Delete every stored blob not in ``keep`` and older than ``min_age_s`` (a blob just
        written may not be recorded on its job yet); returns (removed, kept)."""
        keep = set(keep)
        cutoff = (time.time() if now is None else now) - min_age_s
        removed = kept = 0
        for path in self.root.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*"):
            if path.name in keep or path.name.startswith(".tmp-") or path.stat().st_mtime > cutoff:
                kept += 1
                continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed, kept

    def read(self, digest: str) -> bytes:
        """The stored bytes; BlobMissing or BlobUnreadable, never an error that names the path
        (an output's location stays out of logs and responses)."""
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BlobMissing("stored output bytes are missing") from None
        except OSError as exc:
            raise BlobUnreadable(f"stored output bytes cannot be read ({type(exc).__name__})") from None
