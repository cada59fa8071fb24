"""A raw audio stream's packets cut to their frames: what a remux keeps of an MP3 or FLAC packet.

An MP3 or FLAC file is its frames one after another up to the end of the file, and FFmpeg's parsers
hand any other bytes over as packets or parts of one: bytes appended after the last frame (the
workflow, as a custom node may append it to a file whose format has no room for it) become a packet
of their own (MP3) or the tail of the last frame's (FLAC), bytes between two MP3 frames the head of
the next one's. A stream copy would write them out again. So each MP3 packet is cut to the frame
its header announces (``mp3_frame``: a packet without one is dropped), and a FLAC stream's last
packet to the end its CRC-16 proves (``flac_frame``). Bytes a writer put between two FLAC frames
are not found (that would need a CRC over the whole stream in Python): docs/fleet.md says so.
"""

from __future__ import annotations

#: Bitrates (kbit/s) by index: MPEG-1 layers I, II, III, then MPEG-2/2.5 layer I, and layers II and III.
_BITRATES = {
    (3, 3): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (3, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (3, 1): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (2, 3): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (2, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_BITRATES[(2, 1)] = _BITRATES[(2, 2)]
#: Sample rates (Hz) by version bits: MPEG-1 (3), MPEG-2 (2), MPEG-2.5 (0).
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
#: FLAC's frame CRC-16 (polynomial 0x8005, not reflected, initial 0), one entry per byte value.
_CRC16 = [0] * 256
for _byte in range(256):
    _crc = _byte << 8
    for _ in range(8):
        _crc = ((_crc << 1) ^ 0x8005 if _crc & 0x8000 else _crc << 1) & 0xFFFF
    _CRC16[_byte] = _crc
#: The smallest FLAC frame (a header, one constant subframe, the CRC).
FLAC_MIN_FRAME = 10


def mp3_frame(packet: bytes) -> bytes | None:
    """The MPEG audio frame a packet holds (bytes before it or after it cut), None if it holds none.
    A free-format frame (no bitrate in its header) is kept whole."""
    start = packet.find(b"\xff")
    while 0 <= start <= len(packet) - 4:
        length = _mp3_length(packet[start:start + 4])
        if length == 0:
            return packet[start:]
        if length is not None and start + length <= len(packet):
            return packet[start:start + length]
        start = packet.find(b"\xff", start + 1)
    return None


def _mp3_length(header: bytes) -> int | None:
    """The frame length a 4-byte header announces (0: free format), None if it is not a header."""
    if header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version, layer = (header[1] >> 3) & 3, (header[1] >> 1) & 3
    index, rate_index, padding = header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
    if version == 1 or layer == 0 or index == 15 or rate_index == 3:
        return None
    if index == 0:
        return 0
    bitrate = _BITRATES[(3 if version == 3 else 2, layer)][index] * 1000
    rate = _RATES[version][rate_index]
    if layer == 3:  # layer I: slots of 4 bytes
        return (12 * bitrate // rate + padding) * 4
    if layer == 1 and version != 3:  # layer III of MPEG-2 and 2.5: half the samples per frame
        return 72 * bitrate // rate + padding
    return 144 * bitrate // rate + padding


def flac_frame(packet: bytes) -> bytes:
    """The FLAC frame a packet holds: the packet if its CRC-16 holds over all of it, else its shortest
    prefix over which it holds (what follows is not audio); ValueError if none does."""
    crc, first = 0, None
    for end, byte in enumerate(packet, 1):
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
        if crc == 0 and first is None and end >= FLAC_MIN_FRAME:
            first = end
    if crc == 0:
        return packet
    if first is None:
        raise ValueError("flac_crc")
    return packet[:first]
