"""Blobs in an S3-compatible bucket, ``<prefix>/<aa>/<bb>/<sha256>``: the store for hosts that share no disk.

Credentials come from boto3's own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile,
an instance role); reckon never reads, logs or stores them. botocore's and urllib3's DEBUG lines
name buckets and keys (an output's location), so this module keeps those loggers at INFO or above.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import closing
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from pipeline.blobs.base import BlobUnwritable, is_blob_name, layout, verified
from pipeline.errors import BlobMissing, BlobUnreadable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

#: Seconds to open a connection and to wait for a response's next bytes; a read holds one of
#: gunicorn's threads, so a hung service must not hold it for long.
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 30.0
#: Attempts per request, the first included (botocore's "standard" retry mode: throttling and 5xx).
DEFAULT_MAX_ATTEMPTS = 3
#: Keys per DeleteObjects request (S3's limit).
DELETE_BATCH = 1000
#: Blobs looked at again (HEAD) and then deleted together by gc: small, so a blob written again
#: between its HEAD and the delete is a matter of a few requests' time.
RECHECK_BATCH = 20
#: Loggers whose DEBUG lines carry request URLs (bucket and key).
QUIET_LOGGERS = ("boto3", "botocore", "s3transfer", "urllib3")
#: Error codes that mean "no such object" (GetObject says NoSuchKey, HeadObject only 404).
NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})


def s3_client(endpoint: str = "", *, config: Config | None = None) -> S3Client:
    """An S3 client for ``endpoint`` (AWS's own when empty); path-style addressing for any other
    endpoint, since S3-compatible servers on one host name rarely serve ``bucket.host``."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.INFO:
            logger.setLevel(logging.INFO)
    if config is None:
        config = Config(connect_timeout=DEFAULT_CONNECT_TIMEOUT_S, read_timeout=DEFAULT_READ_TIMEOUT_S,
                        retries={"max_attempts": DEFAULT_MAX_ATTEMPTS, "mode": "standard"},
                        s3={"addressing_style": "path"} if endpoint else {})
    return boto3.session.Session().client("s3", endpoint_url=endpoint or None, config=config)


def _code(exc: Exception) -> str:
    """An error's kind for a message: S3's error code or the exception's class, never its text
    (a server's message may name the bucket and key)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "ClientError"))
    return type(exc).__name__


class S3BlobStore:
    """Blobs as objects in ``bucket`` under ``prefix``; the bucket is the operator's to create."""

    def __init__(self, client: S3Client, bucket: str, prefix: str = "") -> None:
        self.client, self.bucket = client, bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""

    def key(self, digest: str) -> str:
        return self.prefix + layout(digest)

    def put(self, data: bytes) -> str:
        """PUT with a SHA-256 checksum (the service refuses bytes that do not match it), then HEAD:
        the object is there, its length and (where the service keeps one) its checksum ours. S3
        answers a PUT only once the object is stored durably. An existing blob is written again,
        which renews its age for ``collect``."""
        digest = hashlib.sha256(data).hexdigest()
        key = self.key(digest)
        try:
            sent = self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except (ClientError, BotoCoreError) as exc:
            raise BlobUnwritable(f"output bytes cannot be stored ({_code(exc)})") from None
        checksum = base64.b64encode(bytes.fromhex(digest)).decode()
        kept = [answer["ChecksumSHA256"] for answer in (sent, head) if answer.get("ChecksumSHA256")]
        if head["ContentLength"] != len(data) or any(value != checksum for value in kept):
            raise BlobUnwritable("output bytes cannot be stored (the service holds other bytes)")
        return digest

    def read(self, digest: str) -> bytes:
        """The object's bytes, checked against ``digest``: BlobMissing when there is no such object,
        BlobUnreadable for any other failure (a missing bucket or credentials is not a lost output)."""
        key = self.key(digest)
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            with closing(body):
                data = body.read()
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                raise BlobMissing("stored output bytes are missing") from None
            raise BlobUnreadable(f"stored output bytes cannot be read ({_code(exc)})") from None
        except BotoCoreError as exc:
            raise BlobUnreadable(f"stored output bytes cannot be read ({_code(exc)})") from None
        return verified(data, digest)

    def collect(self, keep: Iterable[str], *, min_age_s: float, now: float | None = None) -> tuple[int, int]:
        """Delete every blob under the prefix not in ``keep`` and older than ``min_age_s``; returns
        (removed, kept). Ages are measured on the service's clock (its Date header against the
        objects' LastModified), so a host clock that drifts cannot make a fresh blob look old.
        Objects that are not blobs (other names under the prefix) are neither counted nor touched.

        ``keep`` is read before the listing, which may take minutes: a blob old and held by no job
        then may be written again by a new job meanwhile (the same bytes) and recorded. So each
        page is decided on its own, and the blobs to go are looked at again (HEAD), ``RECHECK_BATCH``
        at a time, just before each such batch is deleted: one written again is young and stays.
        What remains is the moment between a batch's HEADs and its delete, a few requests long, as
        between the local store's stat and unlink."""
        keep = set(keep)
        removed = kept = 0
        try:
            for page, objects in self._pages():
                cutoff = (_service_time(page) if now is None else now) - min_age_s
                old = [obj["key"] for obj in objects if obj["digest"] not in keep and obj["modified"] <= cutoff]
                gone = 0
                for start in range(0, len(old), RECHECK_BATCH):
                    doomed = [key for key in old[start:start + RECHECK_BATCH] if self._still_old(key, min_age_s, now)]
                    gone += len(doomed) - self._delete(doomed)
                removed += gone
                kept += len(objects) - gone
        except (ClientError, BotoCoreError) as exc:
            raise BlobUnreadable(f"stored outputs cannot be listed or removed ({_code(exc)})") from None
        return removed, kept

    def _still_old(self, key: str, min_age_s: float, now: float | None) -> bool:
        """Whether the object is still there and older than ``min_age_s`` (service clock), now."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in NOT_FOUND:
                return False
            raise
        return head["LastModified"].timestamp() <= (_service_time(dict(head)) if now is None else now) - min_age_s

    def _pages(self) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            objects = []
            for obj in page.get("Contents", []):
                digest = self._digest(obj["Key"])
                if digest is not None:
                    objects.append({"key": obj["Key"], "digest": digest, "modified": obj["LastModified"].timestamp()})
            yield dict(page), objects

    def _digest(self, key: str) -> str | None:
        """The sha256 a key stores, or None for a key that is not a blob of this store."""
        name = key[len(self.prefix):]
        return name.rsplit("/", 1)[-1] if is_blob_name(name) else None

    def _delete(self, keys: list[str]) -> int:
        """Delete ``keys`` in batches; returns how many the service refused to delete."""
        failed = 0
        for start in range(0, len(keys), DELETE_BATCH):
            batch: list[ObjectIdentifierTypeDef] = [{"Key": key} for key in keys[start:start + DELETE_BATCH]]
            answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            failed += len(answer.get("Errors", []))
        return failed


def _service_time(page: dict[str, Any]) -> float:
    """The service's clock from a response's Date header; the host's if it sent none."""
    date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    return parsedate_to_datetime(date).timestamp() if date else time.time()
