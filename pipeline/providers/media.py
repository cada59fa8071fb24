"""What an output is (content type from its bytes) and the same output without its metadata.

ComfyUI writes the submitted graph into every file it saves: PNG ``tEXt`` chunks
``prompt`` and one per ``extra_pnginfo`` key (``workflow``), private ``comf``
chunks in animated PNGs, EXIF fields in WEBP, container tags in MP4 and audio files.
reckon promises the workflow stays private, so every output is rewritten before it
is hashed and stored: of an image only the chunks, segments and blocks needed to
show it are kept (an allow-list: custom nodes may add metadata under any name),
each copied byte for byte (CRCs intact); video and audio are remuxed without tags
(``pipeline/providers/containers.py``). Always on; there is no switch to keep metadata.

A file that claims a format by its magic bytes but is broken raises
OutputMalformed rather than being stored as it is (it may carry the workflow).
A format reckon cannot clean (``CLEANED`` does not list it: glTF, SVG, unknown
bytes) raises OutputRefused, unless the operator lets that content type be
stored unchanged (``RECKON_OUTPUT_UNCLEANED_TYPES``).
"""

from __future__ import annotations

import struct

from pipeline.errors import OutputMalformed, OutputRefused
from pipeline.mediatypes import sniff, type_for_name
from pipeline.providers.containers import MUXERS, remux

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG chunks kept: the critical ones PNG defines (an unknown chunk is dropped whatever the case of
#: its name) and the ancillary ones that change how pixels show (colour, transparency, size, animation).
PNG_KEEP = frozenset({b"IHDR", b"PLTE", b"IDAT", b"IEND", b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"iCCP",
                      b"cICP", b"mDCV", b"cLLI", b"sBIT", b"pHYs", b"bKGD", b"acTL", b"fcTL", b"fdAT"})
#: Kept PNG chunks of a fixed size: one of another size is malformed (its extra bytes could carry anything).
PNG_SIZES = {b"IHDR": 13, b"IEND": 0, b"gAMA": 4, b"sRGB": 1, b"cHRM": 32, b"pHYs": 9, b"acTL": 8, b"fcTL": 26,
             b"cICP": 4, b"cLLI": 8, b"mDCV": 24}
#: WEBP chunks kept: image data, alpha, animation, colour profile (EXIF and XMP go).
WEBP_KEEP = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH", b"ANIM", b"ANMF", b"ICCP"})
#: Chunks kept inside an animation frame (``ANMF``): its image data and alpha; unknown ones go.
WEBP_FRAME_KEEP = frozenset({b"VP8 ", b"VP8L", b"ALPH"})
#: WEBP chunks of a fixed size: one of another size is malformed (its extra bytes could carry anything).
WEBP_SIZES = {b"VP8X": 10, b"ANIM": 6}
#: VP8X flag bits announcing EXIF (0x08) and XMP (0x04) chunks; cleared when those go.
WEBP_METADATA_FLAGS = 0x08 | 0x04
#: JPEG segments kept whole: frame headers (SOF0-15), Huffman and arithmetic tables (DHT 0xC4, DAC
#: 0xCC), quantization tables, DNL, restart interval, hierarchical DHP and EXP, scan headers. Of APPn
#: only APP0 (a JFIF header), APP2 (an ICC profile) and APP14 (Adobe's colour transform) are kept,
#: each only holding that (``_jpeg_payload``); APP1 (EXIF, XMP), the other APPn, COM (0xFE) and the
#: reserved JPGn (0xF0-0xFD) go, before the first scan and between scans.
JPEG_KEEP = frozenset(range(0xC0, 0xD0)) - {0xC8} | {0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xDA}
#: GIF application extensions kept: the animation loop count (NETSCAPE2.0 and its ANIMEXTS1.0 twin).
GIF_KEEP_APP = (b"NETSCAPE2.0", b"ANIMEXTS1.0")
#: Content types whose metadata reckon removes; any other is refused unless the operator allows it.
CLEANED = frozenset({"image/png", "image/webp", "image/jpeg", "image/gif", *MUXERS})


def describe(data: bytes, filename: str, *, uncleaned: frozenset[str] = frozenset()) -> tuple[bytes, str]:
    """The output without its metadata, and its content type (from the bytes, else the name).

    ``uncleaned``: content types reckon cannot clean that the operator allows stored as they are."""
    kind = sniff(data)
    if kind is None:  # no magic reckon knows: nothing to clean by, whatever the name says
        named = type_for_name(filename)
        if named in uncleaned:
            return data, named
        raise OutputRefused("output_not_cleanable", named)
    if kind == "image/png":
        return strip_png(data), kind
    if kind == "image/webp":
        return strip_webp(data), kind
    if kind == "image/jpeg":
        return strip_jpeg(data), kind
    if kind == "image/gif":
        return strip_gif(data), kind
    if kind in MUXERS:
        return remux(data, kind), kind
    if kind in uncleaned:
        return data, kind
    raise OutputRefused("output_not_cleanable", kind)


def strip_png(data: bytes) -> bytes:
    """The PNG with only the chunks of PNG_KEEP; anything after IEND is dropped too."""
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
        if PNG_SIZES.get(tag, length) != length:
            raise OutputMalformed("png_chunk_size")
        if tag in PNG_KEEP:
            kept.append(data[offset:end])
        if tag == b"IEND":
            return b"".join(kept)
        offset = end


def strip_webp(data: bytes) -> bytes:
    """The WEBP without EXIF, XMP or unknown chunks (in an animation frame too), its VP8X flags and
    RIFF size made to match."""
    (riff_size,) = struct.unpack_from("<I", data, 4)
    if riff_size + 8 > len(data):
        raise OutputMalformed("webp_truncated")
    kept: list[bytes] = []
    for tag, payload in _riff_chunks(data, 12, riff_size + 8):
        if WEBP_SIZES.get(tag, len(payload)) != len(payload):
            raise OutputMalformed("webp_chunk_size")
        if tag == b"VP8X":
            payload = bytes((payload[0] & ~WEBP_METADATA_FLAGS,)) + payload[1:]
        elif tag == b"ANMF":  # a frame: its 16-byte header, then its own chunks (a spec'd place for unknown ones)
            if len(payload) < 16:
                raise OutputMalformed("webp_truncated")
            payload = payload[:16] + b"".join(_riff_chunk(frame_tag, frame) for frame_tag, frame in
                                              _riff_chunks(payload, 16, len(payload)) if frame_tag in WEBP_FRAME_KEEP)
        elif tag not in WEBP_KEEP:
            continue
        kept.append(_riff_chunk(tag, payload))
    body = b"WEBP" + b"".join(kept)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _riff_chunks(data: bytes, offset: int, end: int) -> list[tuple[bytes, bytes]]:
    """(tag, payload) of every RIFF chunk from ``offset`` to ``end``."""
    chunks = []
    while offset < end:
        if offset + 8 > end:
            raise OutputMalformed("webp_truncated")
        tag = data[offset:offset + 4]
        (length,) = struct.unpack_from("<I", data, offset + 4)
        if offset + 8 + length > end:
            raise OutputMalformed("webp_truncated")
        chunks.append((tag, data[offset + 8:offset + 8 + length]))
        offset += 8 + length + (length & 1)  # chunks are padded to an even size
    return chunks


def _riff_chunk(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload + b"\x00" * (len(payload) & 1)


def strip_jpeg(data: bytes) -> bytes:
    """The JPEG with only the segments of JPEG_KEEP (and APP0, APP2, APP14 holding what they are for),
    before its first scan and between scans; scans unchanged, nothing after EOI."""
    kept = [data[:2]]
    offset = 2
    while True:
        if offset + 2 > len(data) or data[offset] != 0xFF:
            raise OutputMalformed("jpeg_malformed")
        marker = data[offset + 1]
        if marker == 0xFF:  # a fill byte before a marker
            offset += 1
            continue
        if marker == 0xD9:  # end of image: nothing after it
            return b"".join(kept) + b"\xff\xd9"
        if offset + 4 > len(data):
            raise OutputMalformed("jpeg_truncated")
        (length,) = struct.unpack_from(">H", data, offset + 2)
        end = offset + 2 + length
        if length < 2 or end > len(data):
            raise OutputMalformed("jpeg_truncated")
        payload = _jpeg_payload(marker, data[offset + 4:end])
        if payload is not None:
            kept.append(bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload)
        offset = end
        if marker == 0xDA:  # start of scan: its entropy-coded data runs to the next marker
            scan_end = _jpeg_scan_end(data, end)
            kept.append(data[end:scan_end])
            offset = scan_end


def _jpeg_payload(marker: int, payload: bytes) -> bytes | None:
    """What is kept of a segment: tables, frame and scan headers whole; APP0 as a JFIF header without
    thumbnail, APP2 as an ICC profile, APP14 as Adobe's 12 bytes; None for anything else."""
    if marker in JPEG_KEEP:
        return payload
    if marker == 0xE0 and payload.startswith(b"JFIF\x00") and len(payload) >= 14:
        return payload[:12] + b"\x00\x00"  # thumbnail width and height 0: no thumbnail
    if marker == 0xE2 and payload.startswith(b"ICC_PROFILE\x00"):
        return payload
    if marker == 0xEE and payload.startswith(b"Adobe") and len(payload) >= 12:
        return payload[:12]
    return None


def _jpeg_scan_end(data: bytes, offset: int) -> int:
    """Where the entropy-coded data from ``offset`` ends: at the first marker other than a stuffed
    zero, a restart (RST0-7) or a fill byte."""
    while True:
        offset = data.find(b"\xff", offset)
        if offset < 0 or offset + 1 >= len(data):
            raise OutputMalformed("jpeg_truncated")
        following = data[offset + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            offset += 2
        elif following == 0xFF:
            offset += 1
        else:
            return offset


def strip_gif(data: bytes) -> bytes:
    """The GIF without comments, plain-text blocks or application extensions other than the loop
    count; header, colour tables and image data unchanged, graphic controls and the loop count as
    their format's few bytes (``_gif_extension``), nothing after the trailer."""
    if len(data) < 13:
        raise OutputMalformed("gif_truncated")
    offset = 13 + _gif_table(data[10])
    kept = [data[:offset]]
    while offset < len(data):
        block = data[offset]
        if block == 0x3B:  # trailer
            return b"".join(kept) + b"\x3b"
        if block == 0x2C:  # image descriptor, local colour table, LZW code size, data sub-blocks
            if offset + 10 > len(data):
                raise OutputMalformed("gif_truncated")
            end = _gif_sub_blocks(data, offset + 10 + _gif_table(data[offset + 9]) + 1)
            kept.append(data[offset:end])
        elif block == 0x21 and offset + 2 <= len(data):  # extension: label, then sub-blocks
            label = data[offset + 1]
            end = _gif_sub_blocks(data, offset + 2)
            kept.append(_gif_extension(label, data[offset + 2:end]))
        else:
            raise OutputMalformed("gif_malformed")
        offset = end
    raise OutputMalformed("gif_truncated")


def _gif_extension(label: int, blocks: bytes) -> bytes:
    """What is kept of an extension (its sub-blocks ``blocks``): a graphic control as its 4 bytes, a
    loop count (``GIF_KEEP_APP``) as its identifier and loop sub-block; nothing of any other, nor any
    further sub-block of these (each could carry anything)."""
    if label == 0xF9 and blocks[:1] == b"\x04" and len(blocks) >= 6:
        return b"\x21\xf9" + blocks[:5] + b"\x00"
    if label == 0xFF and blocks[:1] == b"\x0b" and blocks[1:12] in GIF_KEEP_APP and blocks[12:14] == b"\x03\x01":
        if len(blocks) >= 17:
            return b"\x21\xff" + blocks[:16] + b"\x00"
    return b""


def _gif_table(flags: int) -> int:
    """Bytes of the colour table a descriptor's packed field announces (none if its top bit is clear)."""
    return 3 * (2 << (flags & 0x07)) if flags & 0x80 else 0


def _gif_sub_blocks(data: bytes, offset: int) -> int:
    """Where the sub-blocks starting at ``offset`` end (after their zero-length terminator)."""
    while True:
        if offset >= len(data):
            raise OutputMalformed("gif_truncated")
        size = data[offset]
        offset += 1 + size
        if size == 0:
            return offset
