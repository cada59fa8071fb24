"""Blobs: durable, content-addressed output storage behind one small interface (:class:`Blobs`).

``base`` is the interface and the layout every store shares, ``local`` a directory on a disk the
processes share, ``s3`` an S3-compatible bucket. Imports only the ground (``pipeline.settings``,
``pipeline.errors``); the state, the processes and the API use a store through ``open_blobs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pipeline.blobs.base import Blobs

if TYPE_CHECKING:
    from pipeline.settings import Settings

__all__ = ["Blobs", "open_blobs"]


def open_blobs(settings: Settings) -> Blobs:
    """The blob store the settings name: ``blob_url`` ``s3://bucket/prefix`` (an S3-compatible
    service at ``s3_endpoint``, AWS's when empty), else the local directory ``blob_dir``."""
    if not settings.blob_url:
        from pipeline.blobs.local import BlobStore

        return BlobStore(settings.blob_dir, sync=settings.blob_sync)
    url = urlsplit(settings.blob_url)
    if "@" in url.netloc:  # never echoed: it may hold a secret
        raise ValueError("RECKON_BLOB_URL holds credentials; boto3 reads them from AWS_* variables")
    if url.scheme != "s3" or not url.hostname or url.query or url.fragment:
        raise ValueError("RECKON_BLOB_URL must be s3://BUCKET or s3://BUCKET/PREFIX (empty: RECKON_BLOB_DIR)")
    from pipeline.blobs.s3 import S3BlobStore, s3_client

    return S3BlobStore(s3_client(settings.s3_endpoint), url.netloc, url.path)
