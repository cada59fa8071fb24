"""The ``wait`` preference of a ``Prefer`` header (RFC 7240): how long a request may be held for its job.

``Prefer`` is a list of preferences separated by commas (several header lines are one list); each is
a token, optionally ``=`` and a token or quoted string, then parameters after ``;``. Names are compared
without case; only the first ``wait`` counts (RFC 7240 section 2). ``wait`` alone is ``MAX_WAIT_SECONDS``;
``wait=N`` is N whole seconds (ASCII digits, quoted or not), at most ``MAX_WAIT_SECONDS``. A ``wait``
whose value is anything else is ignored, as RFC 7240 says of a preference a server does not understand:
the request is answered at once, without ``Preference-Applied``. See docs/api.md "Waiting for the result".
"""

from __future__ import annotations

import re

#: The longest a request is held (s): also what ``Prefer: wait`` without a value asks.
MAX_WAIT_SECONDS = 60

#: One preference: its name, then (optionally) ``=`` and its value; parameters (after ``;``) are ignored.
#: No two neighbouring parts can match the same white space, so a match is linear in the element's length
#: (``\s*`` twice in a row made a name followed by 8 KB of spaces take a second).
_PREFERENCE_RE = re.compile(r'\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^\s;,"]*)\s*)?(?:;.*)?',
                            re.DOTALL)
#: A list element: anything up to a comma that is not inside a quoted string. A quoted string left open
#: runs to the end of the header (then matches no preference), so an open quote is scanned once, not
#: once from each of thousands of them.
_ELEMENT_RE = re.compile(r'(?:"(?:[^"\\]|\\[\s\S])*(?:"|\\?\Z)|[^,"])+')
_DIGITS_RE = re.compile(r"[0-9]{1,100}")


def preferences(header: str | None) -> dict[str, str | None]:
    """Each preference's name (lower case) and value (None when it has none), the first of each name."""
    found: dict[str, str | None] = {}
    for element in _ELEMENT_RE.findall(header or ""):
        match = _PREFERENCE_RE.fullmatch(element)
        if match is None or not element.strip():
            continue
        name, value = match.group(1).lower(), match.group(2)
        if value is not None and value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found.setdefault(name, value)
    return found


def wait_seconds(header: str | None) -> int | None:
    """How long the request asks to be held (s, capped at ``MAX_WAIT_SECONDS``); None when it does not
    ask, or its ``wait`` is not a whole number of seconds (ignored)."""
    found = preferences(header)
    if "wait" not in found:
        return None
    value = found["wait"]
    if value is None or value == "":
        return MAX_WAIT_SECONDS if value is None else None
    if not _DIGITS_RE.fullmatch(value):
        return None
    return min(int(value), MAX_WAIT_SECONDS)


def applied(seconds: int) -> str:
    """The ``Preference-Applied`` value of a wait that was honoured."""
    return f"wait={seconds}"
