"""Where else a custom node could hide the workflow in a file it saves, beyond the metadata blocks
each format names: chunks, segments and extensions a decoder skips or does not need, a codec's
private header, each carrying a canary that no cleaned file may hold (review of issue 31 by attack)."""

from __future__ import annotations

import io
import struct

import av
import pytest

from pipeline.errors import OutputMalformed
from pipeline.providers.containers import xiph_lace, xiph_split
from pipeline.providers.media import describe
from pipeline.providers.sim.comfy import png
from tests.pipeline.test_containers import FILES
from tests.pipeline.test_media import GIF_CONTROL, GIF_LOOP, chunk, gif, png_chunks, sub_blocks

CANARY = b'{"prompt": "canary-51d0e2"}'


def png_with(*chunks: bytes) -> bytes:
    """The simulator's PNG with ``chunks`` right after its IHDR."""
    plain = png("seed")
    return plain[:33] + b"".join(chunks) + plain[33:]


def test_a_png_loses_chunks_it_does_not_know_whatever_their_case() -> None:
    """An unknown chunk whose name starts upper-case (a "critical" one no decoder knows) is not kept
    for its case: only the critical chunks PNG defines are."""
    clean, kind = describe(png_with(chunk(b"PRoM", CANARY), chunk(b"WFLO", CANARY)), "x.png")
    assert kind == "image/png" and CANARY not in clean
    assert [tag for tag, _ in png_chunks(clean)] == [b"IHDR", b"IDAT", b"IEND"]


@pytest.mark.parametrize("data", [
    png("seed")[:8] + chunk(b"IHDR", png("seed")[16:29] + CANARY) + png("seed")[33:],  # IHDR is 13 bytes
    png("seed")[:-12] + chunk(b"IEND", CANARY),  # IEND is empty
    png_with(chunk(b"gAMA", b"\x00\x00\xb1\x8f" + CANARY)),  # gAMA is 4 bytes
])
def test_a_png_chunk_longer_than_its_format_is_never_stored(data: bytes) -> None:
    with pytest.raises(OutputMalformed):
        describe(data, "x.png")


def riff(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload + b"\x00" * (len(payload) & 1)


def animated_webp(*frame_extra: bytes) -> bytes:
    """A one-frame animated WEBP whose frame (``ANMF``) holds its image and then ``frame_extra`` chunks."""
    frame = riff(b"ANMF", bytes(16) + riff(b"VP8L", b"\x2f" + b"\x01" * 6) + b"".join(frame_extra))
    body = b"WEBP" + riff(b"VP8X", b"\x02" + bytes(9)) + riff(b"ANIM", bytes(6)) + frame
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_an_animated_webp_frame_loses_the_chunks_it_may_carry_beyond_its_image() -> None:
    """The WEBP spec lets an animation frame hold unknown chunks after its image: one holds the canary."""
    clean, kind = describe(animated_webp(riff(b"XTRA", CANARY), riff(b"EXIF", CANARY)), "x.webp")
    assert (clean, kind) == (animated_webp(), "image/webp")
    assert describe(clean, "x.webp") == (clean, kind)


def test_a_webp_header_longer_than_its_format_is_never_stored() -> None:
    body = b"WEBP" + riff(b"VP8X", bytes(10) + CANARY) + riff(b"VP8L", b"\x2f" + b"\x01" * 6)
    with pytest.raises(OutputMalformed):
        describe(b"RIFF" + struct.pack("<I", len(body)) + body, "x.webp")


def segment(marker: int, payload: bytes) -> bytes:
    return bytes((0xFF, marker)) + struct.pack(">H", len(payload) + 2) + payload


JFIF = b"JFIF\x00\x01\x02\x00\x00\x01\x00\x01\x00\x00"  # version 1.2, no units, 1:1, no thumbnail
ADOBE = b"Adobe\x00\x64\x00\x00\x00\x00\x01"
HEADER = segment(0xDB, bytes(65)) + segment(0xC2, b"\x08\x00\x01\x00\x01\x01\x01\x11\x00") + segment(0xC4, bytes(17))
SCAN = segment(0xDA, b"\x01\x01\x00\x00\x3f\x00") + b"\x12\xff\x00\x34\xff\xd0\x56"  # a stuffed byte, a restart


def progressive(*between: bytes, app: bytes = b"") -> bytes:
    """A progressive JPEG of two scans with ``between`` them (the format allows tables, COM and APPn there)."""
    return b"\xff\xd8" + segment(0xE0, JFIF) + app + HEADER + SCAN + b"".join(between) + SCAN + b"\xff\xd9"


def test_a_jpeg_loses_comments_and_appn_between_its_scans() -> None:
    data = progressive(segment(0xFE, CANARY), segment(0xE1, b"Exif\x00\x00" + CANARY), segment(0xC4, bytes(17)))
    clean, kind = describe(data, "x.jpg")
    assert (clean, kind) == (progressive(segment(0xC4, bytes(17))), "image/jpeg")  # the table between scans kept


@pytest.mark.parametrize(("app", "kept"), [
    (segment(0xE0, CANARY), b""),  # an APP0 that is not JFIF
    (segment(0xE0, JFIF[:12] + b"\x01\x01" + b"\x00" * 3 + CANARY), segment(0xE0, JFIF)),  # a "thumbnail"
    (segment(0xE2, CANARY), b""),  # an APP2 that is not an ICC profile (FlashPix, MPF, anything)
    (segment(0xEE, ADOBE + CANARY), segment(0xEE, ADOBE)),  # an Adobe segment longer than its 12 bytes
    (segment(0xEE, CANARY), b""),
    (segment(0xF0, CANARY), b""),  # JPG0..JPG13: reserved extensions no decoder reads
], ids=["app0", "jfif-thumbnail", "app2", "adobe-longer", "app14", "jpg0"])
def test_a_jpeg_keeps_app0_app2_app14_only_for_what_they_are_for(app: bytes, kept: bytes) -> None:
    assert describe(progressive(app=app), "x.jpg") == (progressive(app=kept), "image/jpeg")


@pytest.mark.parametrize("extension", [
    b"\x21\xf9\x04\x00\x0a\x00\x00" + sub_blocks(CANARY),  # a graphic control with sub-blocks after its 4 bytes
    b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00" + sub_blocks(CANARY),  # the loop count, then more
    b"\x21\xff\x0bNETSCAPE2.0" + sub_blocks(CANARY),  # the loop's identifier, no loop sub-block
    b"\x21\xff\x0bANIMEXTS1.0\x03\x01\x00\x00" + sub_blocks(CANARY),
], ids=["control", "netscape-more", "netscape-other", "animexts-more"])
def test_a_gif_keeps_of_its_control_and_loop_extensions_only_their_own_bytes(extension: bytes) -> None:
    clean, kind = describe(gif(extension, frames=2), "x.gif")
    assert kind == "image/gif" and CANARY not in clean
    assert clean in (gif(frames=2), gif(GIF_CONTROL, frames=2), gif(GIF_LOOP, frames=2),
                     gif(GIF_LOOP.replace(b"NETSCAPE2.0", b"ANIMEXTS1.0"), frames=2))


def vorbis_comment(*comments: bytes) -> bytes:
    """A Vorbis comment header (the second of a Vorbis stream's three) holding ``comments``."""
    return (b"\x03vorbis" + struct.pack("<I", 6) + b"reckon" + struct.pack("<I", len(comments))
            + b"".join(struct.pack("<I", len(text)) + text for text in comments) + b"\x01")


@pytest.mark.parametrize("muxer", ["webm", "matroska"])
def test_a_vorbis_stream_loses_the_comments_its_codec_private_data_carries(muxer: str) -> None:
    """Matroska keeps a Vorbis stream's three headers in CodecPrivate, the comment header (tags any
    libvorbis writer may fill) among them; a stream copy copies it as it is."""
    out = io.BytesIO()
    with av.open(out, "w", format=muxer) as container:
        stream = container.add_stream("vorbis", rate=44100, layout="stereo", options={"strict": "experimental"})
        packets = []
        for i in range(8):
            frame = av.AudioFrame(format="fltp", layout="stereo", samples=1024)
            for plane in frame.planes:
                plane.update(bytes(plane.buffer_size))
            frame.sample_rate, frame.pts = 44100, i * 1024
            packets += stream.encode(frame)
        packets += stream.encode(None)
        headers = xiph_split(stream.codec_context.extradata)
        stream.codec_context.extradata = xiph_lace([headers[0], vorbis_comment(b"prompt=" + CANARY), headers[2]])
        for packet in packets:
            container.mux(packet)
    data = out.getvalue()
    assert data.count(CANARY) == 1  # in CodecPrivate: the test can fail
    clean, _ = describe(data, "x.webm")
    assert CANARY not in clean
    with av.open(io.BytesIO(clean)) as container:  # a decoder still reads it: the headers it needs are there
        assert xiph_split(container.streams.audio[0].codec_context.extradata)[1] == vorbis_comment()[:7] + bytes(8) + b"\x01"
        assert sum(frame.samples for frame in container.decode(audio=0)) > 0


def packets(data: bytes) -> list[bytes]:
    with av.open(io.BytesIO(data)) as container:
        return [bytes(packet) for packet in container.demux() if packet.size]


@pytest.mark.parametrize("content_type", ["audio/mpeg", "audio/flac"])
def test_bytes_appended_after_the_last_audio_frame_are_not_kept(content_type: str) -> None:
    """A raw audio stream (MP3, FLAC) ends where the file ends: its parser hands bytes appended after
    the last frame (the workflow, as a custom node may append it) over with that frame, or alone."""
    data = FILES[content_type]()
    clean, kind = describe(data + CANARY, "x")
    assert kind == content_type and CANARY not in clean
    assert clean == describe(data, "x")[0]  # every frame kept as it was


def test_bytes_between_two_mp3_frames_are_not_kept() -> None:
    data = FILES["audio/mpeg"]()
    frames = packets(data)
    cut = len(data) - sum(map(len, frames[5:]))
    clean, _ = describe(data[:cut] + CANARY + data[cut:], "x.mp3")
    assert CANARY not in clean and clean == describe(data, "x")[0]
