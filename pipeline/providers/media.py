"""What an output is (content type from its bytes) and the same output without its metadata.

ComfyUI writes the submitted graph into every file it saves: PNG ``tEXt`` chunks
``prompt`` and one per ``extra_pnginfo`` key (``workflow``), private ``comf``
chunks in animated PNGs, and EXIF fields in WEBP. reckon promises the workflow
stays private, so every output is rewritten before it is hashed and stored:
only the chunks and segments needed to show the image are kept (an allow-list:
custom nodes may add metadata under any name), with each kept chunk copied byte
for byte (CRCs intact). Always on; there is no switch to keep metadata.

A file that claims a format by its magic bytes but is broken raises
OutputMalformed rather than being stored as it is (it may carry the workflow).
Formats reckon does not parse (GIF, video, audio) are returned unchanged.
"""

from __future__ import annotations

import struct

from pipeline.errors import OutputMalformed
from pipeline.mediatypes import sniff, type_for_name

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Ancillary PNG chunks kept because they change how pixels show (colour, transparency, size,
#: animation). Critical chunks (upper-case first letter: IHDR, PLTE, IDAT, IEND) are always kept.
PNG_KEEP = frozenset({b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"cICP", b"mDCV", b"cLLI", b"sBIT",
                      b"pHYs", b"bKGD", b"acTL", b"fcTL", b"fdAT"})
#: WEBP chunks kept: image data, alpha, animation, colour profile (EXIF and XMP go).
WEBP_KEEP = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH", b"ANIM", b"ANMF", b"ICCP"})
#: VP8X flag bits announcing EXIF (0x08) and XMP (0x04) chunks; cleared when those go.
WEBP_METADATA_FLAGS = 0x08 | 0x04
#: JPEG APPn markers kept: APP0 (JFIF), APP2 (ICC profile), APP14 (Adobe colour transform).
#: APP1 (EXIF, XMP), the other APPn and COM (0xFE) go.
JPEG_KEEP_APP = frozenset({0xE0, 0xE2, 0xEE})
def describe(data: bytes, filename: str) -> tuple[bytes, str]:
    """The output without its metadata, and its content type (from the bytes, else the name)."""
    kind = sniff(data)
    if kind == "image/png":
        return strip_png(data), kind
    if kind == "image/webp":
        return strip_webp(data), kind
    if kind == "image/jpeg":
        return strip_jpeg(data), kind
    return data, kind or type_for_name(filename)


def strip_png(data: bytes) -> bytes:
    """The PNG with only critical and display chunks; anything after IEND is dropped too."""
    kept = [PNG_SIGNATURE]
    offset = len(PNG_SIGNATURE)
    while True:
        if offset + 12 > len(data):
            raise OutputMalformed("png_truncated")
        (length,) = struct.unpack_from(">I", data, offset)
        tag = data[offset + 4:offset + 8]
        end = offset + 12 + length
        if end > len(data):
            raise OutputMalformed("png_truncated")
        if tag[:1].isupper() or tag in PNG_KEEP:
            kept.append(data[offset:end])
        if tag == b"IEND":
            return b"".join(kept)
        offset = end


def strip_webp(data: bytes) -> bytes:
    """The WEBP without EXIF, XMP or unknown chunks, its VP8X flags and RIFF size made to match."""
    (riff_size,) = struct.unpack_from("<I", data, 4)
    if riff_size + 8 > len(data):
        raise OutputMalformed("webp_truncated")
    kept: list[bytes] = []
    offset = 12
    while offset < riff_size + 8:
        if offset + 8 > len(data):
            raise OutputMalformed("webp_truncated")
        tag = data[offset:offset + 4]
        (length,) = struct.unpack_from("<I", data, offset + 4)
        end = offset + 8 + length + (length & 1)  # chunks are padded to an even size
        if end > len(data):
            raise OutputMalformed("webp_truncated")
        if tag == b"VP8X" and length >= 1:
            flags = data[offset + 8] & ~WEBP_METADATA_FLAGS
            kept.append(data[offset:offset + 8] + bytes((flags,)) + data[offset + 9:end])
        elif tag in WEBP_KEEP:
            kept.append(data[offset:end])
        offset = end
    body = b"WEBP" + b"".join(kept)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def strip_jpeg(data: bytes) -> bytes:
    """The JPEG without EXIF, XMP, comments or other APPn segments before its first scan; scans unchanged."""
    kept = [data[:2]]
    offset = 2
    while True:
        if offset + 4 > len(data) or data[offset] != 0xFF:
            raise OutputMalformed("jpeg_malformed")
        marker = data[offset + 1]
        if marker == 0xFF:  # a fill byte before a marker
            offset += 1
            continue
        (length,) = struct.unpack_from(">H", data, offset + 2)
        end = offset + 2 + length
        if length < 2 or end > len(data):
            raise OutputMalformed("jpeg_truncated")
        metadata = marker == 0xFE or (0xE0 <= marker <= 0xEF and marker not in JPEG_KEEP_APP)
        if marker == 0xDA:  # start of scan: image data up to EOI (escaped: no FFD9 inside), nothing after
            eoi = data.find(b"\xff\xd9", end)
            if eoi < 0:
                raise OutputMalformed("jpeg_truncated")
            return b"".join(kept) + data[offset:eoi + 2]
        if not metadata:
            kept.append(data[offset:end])
        offset = end
