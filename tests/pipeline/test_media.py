"""Outputs lose their metadata (the workflow ComfyUI embeds) and get a content type from their bytes."""

from __future__ import annotations

import io
import struct
import zlib

import av
import pytest

from pipeline.errors import OutputMalformed, OutputRefused
from pipeline.providers.media import describe
from pipeline.providers.sim.comfy import png


def chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(tag, data) of every chunk, checking each CRC."""
    found, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        tag, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        assert struct.unpack_from(">I", data, offset + 8 + length)[0] == zlib.crc32(tag + body)
        found.append((tag, body))
        offset += 12 + length
    return found


def comfy_png() -> bytes:
    """A PNG as ComfyUI's SaveImage and SaveAnimatedPNG write it: the graph in text and private chunks."""
    plain = png("seed")
    ihdr_end = 8 + 12 + 13
    iend = len(plain) - 12
    return (plain[:ihdr_end] + chunk(b"tEXt", b'prompt\x00{"1": "secret"}') + chunk(b"gAMA", b"\x00\x00\xb1\x8f")
            + chunk(b"iTXt", b"workflow\x00\x00\x00\x00\x00{}") + chunk(b"zTXt", b"k\x00\x00x")
            + plain[ihdr_end:iend] + chunk(b"comf", b'prompt\x00{"1": "secret"}') + chunk(b"eXIf", b"MM")
            + plain[iend:] + b"trailing secret")


def test_png_keeps_pixels_and_display_chunks_and_drops_every_text_chunk() -> None:
    clean, kind = describe(comfy_png(), "x.bin")
    assert kind == "image/png"
    assert [tag for tag, _ in png_chunks(clean)] == [b"IHDR", b"gAMA", b"IDAT", b"IEND"]
    assert b"secret" not in clean
    assert describe(clean, "x.png") == (clean, "image/png")  # stripping twice changes nothing
    plain = png("other")
    assert [tag for tag, _ in png_chunks(describe(plain, "a.png")[0])] == [b"IHDR", b"IDAT", b"IEND"]


def webp(*chunks: tuple[bytes, bytes], flags: int = 0x08 | 0x04 | 0x10) -> bytes:
    body = b"WEBP" + b"".join(
        tag + struct.pack("<I", len(data)) + data + b"\x00" * (len(data) & 1)
        for tag, data in (((b"VP8X", bytes((flags,)) + b"\x00" * 9)),) + chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_webp_loses_exif_and_xmp_and_says_so_in_its_header() -> None:
    image = (b"VP8L", b"\x2f" + b"\x01" * 6)  # odd length: padded
    data = webp((b"ALPH", b"\x00\x01"), image, (b"EXIF", b'Exif\x00\x00prompt:{"secret": 1}'), (b"XMP ", b"<x/>"))
    clean, kind = describe(data, "x.png")
    assert kind == "image/webp"
    assert clean == webp((b"ALPH", b"\x00\x01"), image, flags=0x10)  # alpha flag kept, EXIF and XMP flags cleared
    assert struct.unpack_from("<I", clean, 4)[0] == len(clean) - 8


def jpeg(*segments: tuple[int, bytes], scan: bytes = b"\x12\xff\x00\x34") -> bytes:
    body = b"".join(bytes((0xFF, marker)) + struct.pack(">H", len(data) + 2) + data for marker, data in segments)
    return b"\xff\xd8" + body + b"\xff\xda\x00\x02" + scan + b"\xff\xd9"


def test_jpeg_loses_exif_xmp_and_comments_and_keeps_what_decoding_needs() -> None:
    kept = [(0xE0, b"JFIF\x00\x01\x02\x00\x00\x01\x00\x01\x00\x00"), (0xE2, b"ICC_PROFILE\x00"), (0xDB, b"\x00" * 5),
            (0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01")]
    data = jpeg(kept[0], (0xE1, b'Exif\x00\x00prompt:{"secret": 1}'), kept[1], (0xFE, b"secret"), kept[2],
                (0xED, b"Photoshop secret"), kept[3])
    clean, kind = describe(data + b"trailing secret", "x.jpg")
    assert (clean, kind) == (jpeg(*kept), "image/jpeg")


def test_content_type_comes_from_the_bytes_then_the_name() -> None:
    tiny = gif()
    assert describe(tiny, "a.png") == (tiny, "image/gif")  # the bytes win over the name
    assert describe(b"anything", "clip.WEBM", uncleaned=frozenset({"video/webm"})) == (b"anything", "video/webm")
    assert describe(b"anything", "noextension", uncleaned=frozenset({"application/octet-stream"})) == (
        b"anything", "application/octet-stream")


@pytest.mark.parametrize("data", [
    png("seed")[:-5],  # no IEND
    png("seed")[:40],  # a chunk longer than the file
    webp((b"VP8 ", b"\x00" * 10))[:-4],
    b"RIFF\xff\x00\x00\x00WEBPVP8 ",
    jpeg((0xE0, b"JFIF\x00"))[:-2],  # no EOI
    b"\xff\xd8\xff\xe0\x00\x40JFIF",  # a segment longer than the file
])
def test_a_broken_file_of_a_known_format_is_never_stored_as_it_is(data: bytes) -> None:
    with pytest.raises(OutputMalformed):
        describe(data, "x")


def sub_blocks(data: bytes) -> bytes:
    return b"".join(bytes((len(data[i:i + 255]),)) + data[i:i + 255] for i in range(0, len(data), 255)) + b"\x00"


#: GIF blocks: a graphic control, the loop count, and the metadata blocks a GIF may carry.
GIF_CONTROL = b"\x21\xf9\x04\x00\x0a\x00\x00\x00"
GIF_LOOP = b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
GIF_COMMENT = b"\x21\xfe" + sub_blocks(b'prompt {"1": "secret"} ' * 20)  # more than one sub-block
GIF_XMP = b"\x21\xff\x0bXMP DataXMP" + sub_blocks(b"<x:xmpmeta>secret</x:xmpmeta>")
GIF_TEXT = b"\x21\x01\x0c" + bytes(12) + sub_blocks(b"secret")


def gif(*extensions: bytes, frames: int = 1) -> bytes:
    """A 1x1 GIF (two-colour global table) with ``extensions`` before its first frame."""
    header = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"  # LZW: clear, 0, end
    return header + b"".join(extensions) + frame * frames + b"\x3b"


def test_a_gif_keeps_its_frames_timing_and_loop_and_loses_comments_and_other_extensions() -> None:
    data = gif(GIF_COMMENT, GIF_LOOP, GIF_XMP, GIF_CONTROL, GIF_TEXT, frames=2) + b"trailing secret"
    clean, kind = describe(data, "x.gif")
    assert (clean, kind) == (gif(GIF_LOOP, GIF_CONTROL, frames=2), "image/gif")
    assert b"secret" not in clean and describe(clean, "x.gif")[0] == clean
    with av.open(io.BytesIO(clean)) as container:  # still a GIF a decoder reads, both frames
        assert sum(1 for _ in container.decode(video=0)) == 2


@pytest.mark.parametrize("data", [gif()[:-1], gif()[:20], gif(b"\x21\xfe\x05ab"), gif()[:-1] + b"\x99\x3b"])
def test_a_broken_gif_is_never_stored_as_it_is(data: bytes) -> None:
    with pytest.raises(OutputMalformed):
        describe(data, "x.gif")


@pytest.mark.parametrize(("data", "name", "kind"), [
    (b"glTF\x02\x00\x00\x00secret", "mesh.glb", "model/gltf-binary"),  # known, but not cleaned
    (b"<svg><metadata>secret</metadata></svg>", "x.svg", "image/svg+xml"),
    (b"anything", "x.png", "image/png"),  # the name says PNG, the bytes do not: nothing to clean by
    (b"anything", "noextension", "application/octet-stream"),
])
def test_a_format_reckon_cannot_clean_is_refused_unless_the_operator_allows_it(data, name, kind) -> None:
    with pytest.raises(OutputRefused) as refused:
        describe(data, name)
    assert (refused.value.reason, refused.value.content_type) == ("output_not_cleanable", kind)
    with pytest.raises(OutputRefused):
        describe(data, name, uncleaned=frozenset({"image/gif", "video/mp4"}))  # others allowed: still refused
    assert describe(data, name, uncleaned=frozenset({kind})) == (data, kind)  # stored as it came
