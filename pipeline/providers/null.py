"""A provider that runs nothing: every prompt is completed the moment it is sent, with outputs of
fixed size. For benchmarks and capacity planning (``RECKON_PROVIDER_URL=null://?bytes=1024``): the
figures of ``ops/bench/bench.py`` are reckon's own cost, with no provider time in them.

An output's bytes are distinct per operation id and index (a content-addressed store deduplicates
equal bytes, which would make the store's cost vanish from the figures), framed as a PNG (signature,
header, one data chunk, end) so that reckon cleans and stores it as it does a real image, at its size.
It keeps no record: a reconciliation finds no operation (``unknown``), as after a restart, under a
fixed epoch. It keeps the size of each input it is given, so a job's inputs cost one upload per
process and content.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pipeline.providers.base import OperationStatus, OutputRef

DEFAULT_OUTPUT_BYTES = 1024
#: PNG signature, a 1x1 RGB header chunk; the data chunk and end chunk follow (``fetch``).
_PNG_HEAD = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
#: Bytes of framing around the data: the head, the header's CRC, the data chunk's 12, the end chunk's 12.
_PNG_FRAME = len(_PNG_HEAD) + 4 + 12 + 12


class NullProvider:
    name = "null"
    client_id = ""

    def __init__(self, url: str = "null://", *, price_per_output: int = 10) -> None:
        query = parse_qs(urlsplit(url).query)
        self.output_bytes = int(query.get("bytes", [DEFAULT_OUTPUT_BYTES])[0])
        self.price_per_output = price_per_output
        self._submitted: dict[str, list[int]] = {}
        #: The inputs it was given: file name -> size.
        self._inputs: dict[str, int] = {}

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int], *,
               front: bool = False) -> dict[str, str] | None:
        self._submitted[operation_id] = indices
        return None

    def cancel(self, operation_id: str) -> None:
        self._submitted.pop(operation_id, None)

    def status(self, operation_id: str) -> OperationStatus:
        indices = self._submitted.pop(operation_id, None)
        if indices is None:
            return OperationStatus("unknown")
        refs = [OutputRef(index, f"{operation_id}:{index}", content_type="image/png")
                for index in indices]
        return OperationStatus("completed", refs, produced=len(refs))

    def fetch(self, ref: OutputRef) -> bytes:
        seed = hashlib.sha256(ref.filename.encode()).digest()
        size = max(self.output_bytes - _PNG_FRAME, len(seed))
        return png_frame((seed * (size // len(seed) + 1))[:size])

    def epoch(self) -> str:
        return "null"

    def input_size(self, filename: str) -> int | None:
        return self._inputs.get(filename)

    def upload_input(self, filename: str, data: bytes, *, overwrite: bool = False) -> None:
        self._inputs[filename] = len(data)

    def offers(self) -> None:
        return None


def png_frame(data: bytes) -> bytes:
    """``data`` as the one IDAT chunk of a PNG (not a decodable image: a benchmark's payload)."""
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))
    return _PNG_HEAD + struct.pack(">I", zlib.crc32(_PNG_HEAD[12:])) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
