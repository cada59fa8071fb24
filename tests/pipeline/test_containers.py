"""Video and audio outputs are remuxed without their tags: files made here with PyAV carry a canary
in their container and stream tags (as ComfyUI's SaveVideo and SaveAudio write the workflow there)."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import pytest

from pipeline.errors import OutputMalformed
from pipeline.providers.media import describe

CANARY = "canary-7f3a9c"


def media(muxer: str, video: str | None = None, audio: str | None = None, rate: int = 16000,
          options: dict[str, str] | None = None) -> bytes:
    """A tiny file (4 frames of 64x64, 8 audio frames of silence) with the canary in every tag."""
    out = io.BytesIO()
    with av.open(out, "w", format=muxer, options=options or {}) as container:
        for key in ("prompt", "workflow", "comment", "title"):
            container.metadata[key] = f'{{"{key}": "{CANARY}"}}'
        streams = []
        if video:
            stream = container.add_stream(video, rate=8)
            stream.width = stream.height = 64
            stream.pix_fmt = "yuv420p"
            streams.append(stream)
        if audio:
            streams.append(container.add_stream(audio, rate=rate, layout="mono"))
        for stream in streams:
            stream.metadata["title"] = CANARY
            for frame in (_video_frames() if stream.type == "video" else _audio_frames(stream, rate)):
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    return out.getvalue()


def _video_frames() -> list[av.VideoFrame]:
    frames = []
    for i in range(4):
        frame = av.VideoFrame(64, 64, "yuv420p")
        for plane in frame.planes:
            plane.update(bytes([i * 40]) * plane.buffer_size)
        frame.pts = i
        frames.append(frame)
    return frames


def _audio_frames(stream: av.audio.AudioStream, rate: int) -> list[av.AudioFrame]:
    size = stream.codec_context.frame_size or 1024
    frames = []
    for i in range(8):
        frame = av.AudioFrame(format=stream.codec_context.format.name, layout="mono", samples=size)
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.sample_rate, frame.pts = rate, i * size
        frames.append(frame)
    return frames


def streams(data: bytes) -> list[tuple[str, str, int]]:
    """(type, codec, packets) of every stream."""
    with av.open(io.BytesIO(data)) as container:
        found = [(stream.type, stream.codec_context.name if stream.codec_context else "")
                 for stream in container.streams]
        packets = [0] * len(found)
        for packet in container.demux():
            if packet.size:
                packets[packet.stream.index] += 1
    return [(kind, codec, count) for (kind, codec), count in zip(found, packets)]


FILES = {  # content type -> how ComfyUI (or a custom node) makes one
    "video/mp4": lambda: media("mp4", "libx264", "aac", options={"movflags": "use_metadata_tags"}),
    "video/quicktime": lambda: media("mov", "libx264"),
    "video/webm": lambda: media("webm", "libvpx-vp9", "libopus", rate=48000),
    "video/x-matroska": lambda: media("matroska", "libx264", "flac"),
    "audio/flac": lambda: media("flac", audio="flac"),
    "audio/ogg": lambda: media("ogg", audio="libopus", rate=48000),
    "audio/mpeg": lambda: media("mp3", audio="libmp3lame"),
    "audio/mp4": lambda: media("ipod", audio="aac"),
    "audio/wav": lambda: media("wav", audio="pcm_s16le"),
}


@pytest.mark.parametrize("content_type", sorted(FILES))
def test_a_container_is_remuxed_without_any_tag_and_keeps_every_packet(content_type: str) -> None:
    data = FILES[content_type]()
    assert CANARY.encode() in data  # the muxer wrote the tags: the test can fail
    clean, kind = describe(data, "no-name-needed")
    assert kind == content_type
    assert CANARY.encode() not in clean and b"prompt" not in clean and b"workflow" not in clean
    assert streams(clean) == streams(data)  # the same streams, every packet copied
    assert describe(data, "again") == (clean, kind)  # the same bytes every time: one hash per output
    with av.open(io.BytesIO(clean)) as container:  # it decodes
        assert next(container.decode(container.streams[0])) is not None


def test_an_mp3_gets_no_id3_block() -> None:
    clean, _ = describe(media("mp3", audio="libmp3lame"), "x.mp3")
    assert not clean.startswith(b"ID3") and b"TAG" not in clean[-128:]


@pytest.mark.parametrize("content_type", ["video/mp4", "audio/flac", "video/webm"])
def test_a_broken_container_is_never_stored_as_it_is(content_type: str) -> None:
    data = FILES[content_type]()
    with pytest.raises(OutputMalformed):
        describe(data[:48], "x")  # the magic bytes, then nothing a demuxer can read


def test_chapters_and_attachments_are_dropped() -> None:
    """A Matroska file can carry the canary in a chapter title and an attached file."""
    out = io.BytesIO()
    with av.open(out, "w", format="matroska") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        container.add_attachment(f"{CANARY}.json", "application/json", f'{{"prompt": "{CANARY}"}}'.encode())
        container.set_chapters([{"id": 1, "start": 0, "end": 4, "time_base": Fraction(1, 8),
                                 "metadata": {"title": CANARY}}])
        for frame in _video_frames():
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = out.getvalue()
    assert data.count(CANARY.encode()) == 3 and [kind for kind, _, _ in streams(data)] == ["video", "attachment"]
    clean, kind = describe(data, "x.mkv")
    assert kind == "video/x-matroska" and CANARY.encode() not in clean
    assert streams(clean) == [("video", "h264", 4)]
    with av.open(io.BytesIO(clean)) as container:
        assert container.chapters() == []


def test_cover_art_is_dropped() -> None:
    """A FLAC with a picture (an attached_pic video stream): only the audio is kept."""
    out = io.BytesIO()
    with av.open(out, "w", format="flac") as container:
        audio = container.add_stream("flac", rate=16000, layout="mono")
        picture = container.add_stream("png")
        picture.width = picture.height = 8
        picture.pix_fmt = "rgb24"
        picture.disposition = av.stream.Disposition.attached_pic
        frame = av.VideoFrame(8, 8, "rgb24")
        frame.pts = 0
        container.mux(picture.encode(frame))
        container.mux(picture.encode(None))
        for sound in _audio_frames(audio, 16000):
            container.mux(audio.encode(sound))
        container.mux(audio.encode(None))
    data = out.getvalue()
    assert b"\x89PNG" in data and [kind for kind, _, _ in streams(data)] == ["audio", "video"]
    clean, kind = describe(data, "x.flac")
    assert kind == "audio/flac" and b"\x89PNG" not in clean and streams(clean) == [("audio", "flac", 8)]
