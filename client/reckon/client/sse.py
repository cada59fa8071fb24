"""Server-Sent Events as the WHATWG HTML standard reads them, from a stream of lines.

A message is dispatched at its blank line; one the connection cut before that line is dropped,
so a reader that resumes after the last id it was given sees the cut message again, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """One block of fields: an event (``data`` set) or only a new reconnection time (``retry``, ms)."""

    id: str | None = None
    event: str = "message"
    data: str | None = None
    retry: int | None = None


def messages(readline: Callable[[], bytes]) -> Iterator[Message]:
    """Each complete message until the stream ends; comments (``: ping``) are skipped."""
    fields: dict[str, str] = {}
    data: list[str] = []
    while True:
        line = readline()
        if not line.endswith((b"\n", b"\r")):  # the end of the stream, or a line cut off by it
            return
        text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
        if text:
            if not text.startswith(":"):
                name, _, value = text.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name in ("id", "event", "retry"):
                    fields[name] = value
            continue
        if fields or data:
            retry = fields.get("retry", "")
            yield Message(id=fields.get("id"), event=fields.get("event") or "message",
                          data="\n".join(data) if data else None,
                          retry=int(retry) if retry.isascii() and retry.isdigit() else None)
        fields, data = {}, []
