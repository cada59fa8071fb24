"""What kind of file some bytes are: a content type from their magic numbers, else from a name.

One table for the whole service: uploaded inputs (``pipeline/inputs.py``) and stored outputs
(``pipeline/providers/media.py``) are typed by the same rules. A fixed table, not the ``mimetypes``
module, whose answers depend on the machine's files.
"""

from __future__ import annotations

DEFAULT_CONTENT_TYPE = "application/octet-stream"

#: Content type -> the file extension reckon gives it (an input's name on a server ends with it).
EXTENSIONS = {
    "image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif",
    "audio/wav": "wav", "audio/flac": "flac", "audio/mpeg": "mp3", "audio/ogg": "ogg", "audio/mp4": "m4a",
    "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov", "video/x-matroska": "mkv",
    "model/gltf-binary": "glb", "image/svg+xml": "svg",
}
#: Extension -> content type, for bytes whose magic says nothing we know (ComfyUI names its files by format).
BY_EXTENSION = {ext: kind for kind, ext in EXTENSIONS.items()} | {
    "jpeg": "image/jpeg", "opus": "audio/ogg", "oga": "audio/ogg", "m4v": "video/mp4",
}

#: ISO base media ``ftyp`` major brands that are not plain MP4 video.
_FTYP_BRANDS = {b"qt  ": "video/quicktime", b"M4A ": "audio/mp4", b"M4B ": "audio/mp4"}
#: MPEG audio frame headers (sync bits, layer III, versions 1, 2 and 2.5) an MP3 without ID3 starts with.
_MP3_SYNC = (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2", b"\xff\xe3", b"\xff\xe2")


def sniff(data: bytes) -> str | None:
    """The content type the magic bytes announce, or None."""
    head = data[:64]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if head[:4] == b"RIFF":
        return {b"WEBP": "image/webp", b"WAVE": "audio/wav"}.get(head[8:12])
    if head[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(head[8:12], "video/mp4")
    if head.startswith(b"\x1a\x45\xdf\xa3"):  # EBML: Matroska, or its WebM profile (doctype "webm")
        return "video/webm" if b"webm" in head else "video/x-matroska"
    if head.startswith(b"fLaC"):
        return "audio/flac"
    if head.startswith(b"OggS"):
        return "audio/ogg"
    if head.startswith(b"ID3") or head[:2] in _MP3_SYNC:
        return "audio/mpeg"
    if head.startswith(b"glTF"):
        return "model/gltf-binary"
    return None


def type_for_name(filename: str) -> str:
    """The content type a file name's extension suggests."""
    _, dot, extension = filename.rpartition(".")
    return BY_EXTENSION.get(extension.lower(), DEFAULT_CONTENT_TYPE) if dot else DEFAULT_CONTENT_TYPE


def kind_of(content_type: str) -> str:
    """``image``, ``audio``, ``video`` or ``other``: the family a content type belongs to."""
    family = content_type.split("/", 1)[0]
    return family if family in ("image", "audio", "video") else "other"


def content_types(value: str) -> frozenset[str]:
    """A comma-separated list of content types (``type/subtype``), lower-cased."""
    types = frozenset(part.strip().lower() for part in value.split(",") if part.strip())
    for kind in types:
        if kind.count("/") != 1 or not all(kind.split("/")):
            raise ValueError(f"not a content type: {kind!r}")
    return types
