"""Video and audio outputs without their tags: a remux with PyAV, stream copy, no re-encode.

ComfyUI v0.3.64 writes the prompt and the workflow into an MP4's container tags (``SaveVideo``,
``movflags=use_metadata_tags``) and into every audio file's tags (``SaveAudio`` and its MP3 and
Opus kin). The remux copies each audio and video stream's packets into a new container of the
same format and nothing else: no container or stream tags, no chapters, no attachments, no
subtitle or data streams, no cover art (an attached picture). The muxer writes no tag of its
own (``fflags=+bitexact``: no ``encoder`` tag, a fixed Matroska segment id, so the same input
gives the same bytes) and no ID3 block for MP3. The codecs' own headers are copied as they are
(an H.264 stream's parameter sets, FLAC's STREAMINFO), but for a Vorbis or Theora comment header:
Ogg's muxer rebuilds it (and Opus's) from the (now empty) tags, Matroska's would copy it from the
codec's private data, so it is replaced by an empty one (``EMPTY_COMMENTS``).

The result is opened again and must show the same streams; a file its magic bytes call a
container that PyAV cannot read, or that keeps no stream, raises OutputMalformed.
"""

from __future__ import annotations

import io

import av

from pipeline.errors import OutputMalformed
from pipeline.providers.frames import flac_frame, mp3_frame

#: Content type -> the FFmpeg muxer that writes it again.
MUXERS = {
    "video/mp4": "mp4", "video/quicktime": "mov", "audio/mp4": "ipod", "video/webm": "webm",
    "video/x-matroska": "matroska", "audio/flac": "flac", "audio/ogg": "ogg", "audio/mpeg": "mp3",
    "audio/wav": "wav",
}
#: Muxer options beyond ``fflags=+bitexact``: an MP3 gets neither an ID3v2 nor an ID3v1 block.
MUXER_OPTIONS = {"mp3": {"id3v2_version": "0", "write_id3v1": "0"}}
#: Tags a remuxed file shows that come from the muxer itself, never from the input: ISO brands, the
#: ``Lavf`` encoder name Matroska always writes, a track's handler, language and vendor, its duration.
OWN_TAGS = frozenset({"major_brand", "minor_version", "compatible_brands", "encoder", "language", "handler_name",
                      "vendor_id", "DURATION"})
#: Stream types that are the media itself; everything else (subtitles, data, attachments) goes.
KEPT_TYPES = ("audio", "video")
#: Codecs whose private data (Matroska's CodecPrivate) holds their three Xiph headers, the second a
#: comment header any writer may fill with tags: it is replaced by this one, empty (no vendor, no
#: comment). Ogg's muxer rebuilds it from the stream's tags anyway; Matroska's copies it as it is.
EMPTY_COMMENTS = {"vorbis": b"\x03vorbis" + bytes(8) + b"\x01", "theora": b"\x81theora" + bytes(8)}


def remux(data: bytes, content_type: str) -> bytes:
    """``data`` (a container of ``content_type``, one of MUXERS) without any tag, its streams copied."""
    muxer = MUXERS[content_type]
    try:
        cleaned = _remux(data, muxer)
        _check(cleaned, _streams(data))
    except (av.FFmpegError, ValueError, IndexError) as exc:  # unreadable, or a stream its muxer refuses
        raise OutputMalformed(f"{muxer}_unreadable") from exc
    return cleaned


def _remux(data: bytes, muxer: str) -> bytes:
    out = io.BytesIO()
    with av.open(io.BytesIO(data), "r") as source:
        kept = [stream for stream in source.streams if _kept(stream)]
        if not kept:
            raise OutputMalformed(f"{muxer}_no_streams")
        with av.open(out, "w", format=muxer, options=MUXER_OPTIONS.get(muxer, {}),
                     container_options={"fflags": "+bitexact"}) as target:
            copies = {}
            for stream in kept:
                copy = target.add_stream_from_template(stream)
                for key in list(copy.metadata):  # none today; a template that carried tags must not
                    del copy.metadata[key]
                if stream.codec.canonical_name in EMPTY_COMMENTS and stream.codec_context.extradata:
                    copy.codec_context.extradata = _without_comments(stream.codec_context.extradata,
                                                                     EMPTY_COMMENTS[stream.codec.canonical_name])
                copies[stream.index] = copy
            codecs = {stream.index: stream.codec.canonical_name for stream in kept}
            last: dict[int, av.Packet | None] = {index: None for index, codec in codecs.items() if codec == "flac"}
            for packet in source.demux(kept):
                if not packet.size:  # the demuxer's flush packet at the end: nothing to write
                    continue
                index = packet.stream.index
                if index in last:  # one packet held back: the last one is cut to its frame
                    packet, last[index] = last[index], packet
                elif codecs[index] == "mp3":
                    packet = _cut(packet, mp3_frame(bytes(packet)))
                if packet is not None:
                    packet.stream = copies[index]
                    target.mux(packet)
            for index, packet in last.items():
                if packet is not None:
                    packet = _cut(packet, flac_frame(bytes(packet)))
                    packet.stream = copies[index]
                    target.mux(packet)
    return out.getvalue()


def _without_comments(private: bytes, empty: bytes) -> bytes:
    """Xiph-laced Vorbis or Theora headers with the second, the comment header, replaced by ``empty``."""
    headers = xiph_split(private)
    if len(headers) != 3 or not headers[2]:
        raise ValueError("xiph_headers")
    return xiph_lace([headers[0], empty, headers[2]])


def xiph_split(private: bytes) -> list[bytes]:
    """The headers Xiph lacing holds (a count less one, the sizes of all but the last, then the headers,
    as Matroska's CodecPrivate keeps them); ValueError if the sizes run past the bytes."""
    try:
        count, offset, sizes = private[0] + 1, 1, []
        for _ in range(count - 1):
            size = 0
            while private[offset] == 0xFF:
                size, offset = size + 255, offset + 1
            sizes.append(size + private[offset])
            offset += 1
    except IndexError:
        raise ValueError("xiph_headers") from None
    sizes.append(len(private) - offset - sum(sizes))
    if sizes[-1] < 0:
        raise ValueError("xiph_headers")
    headers = []
    for size in sizes:
        headers.append(private[offset:offset + size])
        offset += size
    return headers


def xiph_lace(headers: list[bytes]) -> bytes:
    """``headers`` Xiph-laced (the inverse of ``xiph_split``)."""
    sizes = b"".join(b"\xff" * (len(header) // 255) + bytes((len(header) % 255,)) for header in headers[:-1])
    return bytes((len(headers) - 1,)) + sizes + b"".join(headers)


def _cut(packet: av.Packet, frame: bytes | None) -> av.Packet | None:
    """``packet`` holding only ``frame``, its timing kept; None if there is no frame to keep."""
    if frame is None or len(frame) == packet.size:
        return None if frame is None else packet
    cut = av.Packet(frame)
    cut.pts, cut.dts, cut.duration, cut.time_base = packet.pts, packet.dts, packet.duration, packet.time_base
    cut.is_keyframe = packet.is_keyframe
    return cut


def _kept(stream: av.stream.Stream) -> bool:
    return stream.type in KEPT_TYPES and not stream.disposition & av.stream.Disposition.attached_pic


def _streams(data: bytes) -> list[tuple[str, str]]:
    """(type, codec) of every stream a remux keeps, in order."""
    with av.open(io.BytesIO(data), "r") as container:
        return [(stream.type, stream.codec_context.name) for stream in container.streams if _kept(stream)]


def _check(cleaned: bytes, expected: list[tuple[str, str]]) -> None:
    """The remuxed file opens and shows the streams it was made from, with tags on none of them."""
    with av.open(io.BytesIO(cleaned), "r") as container:
        found = [(stream.type, stream.codec_context.name) for stream in container.streams]
        tagged = bool(_tags(container.metadata)) or any(_tags(stream.metadata) for stream in container.streams)
    if found != expected:
        raise OutputMalformed("remux_lost_streams")
    if tagged:
        raise OutputMalformed("remux_kept_tags")


def _tags(metadata: dict[str, str]) -> dict[str, str]:
    """Tags other than those the muxer writes of itself and demuxers report (brands, handler, duration)."""
    return {key: value for key, value in metadata.items() if key not in OWN_TAGS}
