"""A committed offset's metadata as PostgreSQL's text keeps it.

Kafka keeps an offset's metadata exactly as the client sent it, NUL characters included, and
confluent-kafka's Python binding relies on that: it sends every metadata string with its C
terminator (a NUL) and reads it back expecting one (without it, `""` comes back as None and any
other string is read past its end). PostgreSQL's text cannot hold NUL, so the text stored writes
each NUL as ESCAPE "0" and each ESCAPE as ESCAPE ESCAPE, ESCAPE being U+FFFF (a Unicode
noncharacter, kept for such internal use); reading reverses it. A string with neither is stored as
it is, so what was stored before this encoding reads back unchanged unless it held U+FFFF followed
by "0" or U+FFFF."""

from __future__ import annotations

import re

ESCAPE = "\uffff"
_ESCAPED = re.compile(f"{ESCAPE}([{ESCAPE}0])")


def stored(metadata: str | None) -> str | None:
    """The text the metadata column holds for `metadata`."""
    if metadata is None or ("\0" not in metadata and ESCAPE not in metadata):
        return metadata
    return metadata.replace(ESCAPE, ESCAPE + ESCAPE).replace("\0", ESCAPE + "0")


def read(text: str | None) -> str | None:
    """The metadata the column's `text` stands for."""
    if text is None or ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda match: ESCAPE if match[1] == ESCAPE else "\0", text)
