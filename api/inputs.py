"""Uploaded inputs: ``POST /v1/inputs`` (the file's bytes as the body), ``GET`` and ``DELETE
/v1/inputs/{sha256}``. The content type comes from the bytes; the bytes are in the blob store,
durably, before the record is written and the answer sent (docs/api.md "Inputs")."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import falcon

from api.problems import Problem
from pipeline.blobs import Blobs
from pipeline.blobs.base import BlobUnwritable
from pipeline.errors import InputInUse, OverQuota
from pipeline.inputs import name_for
from pipeline.mediatypes import DEFAULT_CONTENT_TYPE, sniff
from pipeline.settings import Settings
from pipeline.state.inputs import ACCEPTED, Input, InputStore

SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: Bytes read from the request at a time.
CHUNK = 1 << 20
#: Declared types that say nothing of the content: the bytes decide.
UNSPECIFIC = frozenset({"", DEFAULT_CONTENT_TYPE, "*/*"})
#: Other spellings of a type ``sniff`` names, as clients and browsers send them.
ALIASES = {"image/jpg": "image/jpeg", "audio/x-wav": "audio/wav", "audio/wave": "audio/wav",
           "audio/vnd.wave": "audio/wav", "audio/x-flac": "audio/flac", "audio/mp3": "audio/mpeg",
           "audio/x-m4a": "audio/mp4", "video/x-m4v": "video/mp4", "audio/opus": "audio/ogg"}


def read_upload(req: falcon.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes: a Content-Length above it is refused before anything is read, a
    body without one (chunked) as soon as it passes the limit. A body that ends before its Content-Length,
    or chunked and cut before its last chunk (the client stopped sending), is 400: what came is not the file."""
    if (req.content_length or 0) > limit:
        raise _too_large(limit)
    chunked = req.content_length is None and req.env.get("wsgi.input_terminated")
    stream = req.stream if chunked else req.bounded_stream
    data = bytearray()
    while chunk := _read(stream, min(CHUNK, limit + 1 - len(data))):
        data += chunk
        if len(data) > limit:
            raise _too_large(limit)
    if req.content_length is not None and len(data) < req.content_length:
        raise _incomplete()
    return bytes(data)


def _read(stream: Any, size: int) -> bytes:
    try:
        return bytes(stream.read(size))
    except Exception:  # the server's reader: a chunked body cut short, a connection lost or timed out
        raise _incomplete() from None


def _incomplete() -> Problem:
    return Problem(400, "input-incomplete", "Input incomplete",
                   "the body ended before the file did (the client stopped sending); nothing was stored")


def _too_large(limit: int) -> Problem:
    return Problem(413, "input-too-large", "Input too large", f"an input is at most {limit} bytes", limit=limit)


def content_type_of(data: bytes, declared: str) -> str:
    """The type the bytes are, if ComfyUI's loaders read it and it agrees with ``declared``; else 415."""
    declared = ALIASES.get(declared, declared)
    found = sniff(data)
    if found not in ACCEPTED:
        raise Problem(415, "input-type-unsupported", "Input type not supported",
                      "the bytes are no image, audio or video file ComfyUI's loaders read (PNG, JPEG, WEBP, GIF, "
                      "WAV, FLAC, MP3, Ogg, M4A, MP4, MOV, WebM, Matroska)")
    if declared not in UNSPECIFIC and declared != found:
        raise Problem(415, "input-type-unsupported", "Input type not supported",
                      f"the body was declared {declared[:100]} but its bytes are {found}", content_type=found)
    return found


def _sha256(value: str) -> str:
    if not SHA256_RE.fullmatch(value):
        raise Problem(404, "input-not-found", "Input not found", "an input is named by its sha256: 64 hex digits")
    return value


class Inputs:
    def __init__(self, inputs: InputStore, blobs: Blobs, settings: Settings) -> None:
        self.inputs, self.blobs, self.settings = inputs, blobs, settings

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        tenant = req.context.tenant
        data = read_upload(req, self.settings.input_max_bytes)
        if not data:
            raise Problem(400, "input-empty", "Empty input", "the body is the file's bytes: send at least one")
        declared = (req.content_type or "").partition(";")[0].strip().lower()
        content_type = content_type_of(data, declared)
        sha256 = hashlib.sha256(data).hexdigest()
        item = Input(name_for(sha256, content_type), sha256, len(data), content_type)
        if self.inputs.get(tenant, sha256) is None:  # new to the tenant: refused now if over its quota anyway
            held, quota, count = self.inputs.held(tenant, self.settings.input_quota_bytes)
            if held + item.bytes > quota or count >= self.settings.input_max_count:
                raise _over_quota(OverQuota(held, quota, item.bytes, count, self.settings.input_max_count))
        try:  # every time, before the record: it may have been deleted since the read, its blob collected
            self.blobs.put(data)
        except BlobUnwritable:
            raise Problem(503, "input-unavailable", "Input cannot be stored now",
                          "the blob store did not take the bytes; nothing was recorded",
                          headers={"Retry-After": "5"}) from None
        try:
            stored, created = self.inputs.put(tenant, item, default_quota=self.settings.input_quota_bytes,
                                              max_inputs=self.settings.input_max_count)
        except OverQuota as over:
            raise _over_quota(over) from None
        resp.status = falcon.HTTP_201 if created else falcon.HTTP_200
        resp.location = f"/v1/inputs/{sha256}"
        resp.media = stored.view()


def _over_quota(over: OverQuota) -> Problem:
    return Problem(507, "input-quota-exceeded", "Input quota exceeded", str(over),
                   held=over.held, quota=over.quota, bytes=over.size, inputs=over.inputs, max_inputs=over.max_inputs)


class OneInput:
    """One input of the tenant's; another tenant's is answered as if it did not exist."""

    def __init__(self, inputs: InputStore) -> None:
        self.inputs = inputs

    def on_get(self, req: falcon.Request, resp: falcon.Response, sha256: str) -> None:
        found = self.inputs.get(req.context.tenant, _sha256(sha256))
        if found is None:
            raise Problem(404, "input-not-found", "Input not found")
        resp.media = found.view()

    def on_delete(self, req: falcon.Request, resp: falcon.Response, sha256: str) -> None:
        try:
            removed = self.inputs.delete(req.context.tenant, _sha256(sha256))
        except InputInUse as busy:
            raise Problem(409, "input-in-use", "Input in use",
                          "unfinished jobs name this input; delete it once they have ended",
                          jobs=list(busy.jobs[:20])) from None
        if removed is None:
            raise Problem(404, "input-not-found", "Input not found")
        resp.status = falcon.HTTP_204
