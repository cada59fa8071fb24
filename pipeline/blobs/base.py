"""What every blob store is: the interface, the content-addressed layout, and the read check."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol

from pipeline.errors import BlobUnreadable, ReckonError

HEX = frozenset("0123456789abcdef")


class BlobUnwritable(ReckonError):
    """Output bytes could not be stored durably (an I/O or storage-service error); the message
    names the error's kind, never a location."""


class Blobs(Protocol):
    """What the worker (put), the API (read) and ``reckon blobs gc`` (collect) need of a blob store."""

    def put(self, data: bytes) -> str:
        """Store ``data`` durably; return its sha256 (hex). Raises BlobUnwritable."""
        ...

    def read(self, digest: str) -> bytes:
        """The bytes stored under ``digest``, checked against it. Raises BlobMissing or BlobUnreadable."""
        ...

    def collect(self, keep: Iterable[str], *, min_age_s: float, now: float | None = None) -> tuple[int, int]:
        """Delete every stored blob not in ``keep`` and older than ``min_age_s``; (removed, kept)."""
        ...


def layout(digest: str) -> str:
    """``aa/bb/<sha256>``: a blob's place under the store's root (directory or key prefix)."""
    if len(digest) != 64 or not HEX.issuperset(digest):
        raise ValueError("not a sha256 digest")
    return f"{digest[:2]}/{digest[2:4]}/{digest}"


def is_blob_name(name: str) -> bool:
    """Whether ``name`` (relative to the store's root) is where :func:`layout` puts some digest."""
    digest = name.rsplit("/", 1)[-1]
    return len(digest) == 64 and HEX.issuperset(digest) and name == f"{digest[:2]}/{digest[2:4]}/{digest}"


def verified(data: bytes, digest: str) -> bytes:
    """``data`` if it hashes to ``digest``; BlobUnreadable if the store handed back other bytes."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise BlobUnreadable("stored output bytes do not match their sha256")
    return data
