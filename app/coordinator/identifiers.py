"""The longest identifier the server stores (transactional id, group id, member id, an ACL rule's
principal and resource name, key id), in UTF-8 bytes, for both front doors. PostgreSQL indexes
them, and an index row holds at most about 2.7 kB, shared in some indexes by two identifiers (group
id and member id; principal and resource name): a longer one would fail its statement instead of
being refused with a message."""

from __future__ import annotations

from app.errors import invalid_request

MAX_IDENTIFIER_BYTES = 1024


def identifier_bytes(value: str) -> int:
    """The identifier's length as stored: UTF-8 (a lone surrogate counted as its 3 bytes)."""
    return len(value.encode("utf-8", "surrogatepass"))


def check_identifier(what: str, value: str) -> None:
    """Raises INVALID_REQUEST, naming `what`, for an identifier over MAX_IDENTIFIER_BYTES."""
    size = identifier_bytes(value)
    if size > MAX_IDENTIFIER_BYTES:
        raise invalid_request(
            f"{what} is {size} bytes in UTF-8: expected at most {MAX_IDENTIFIER_BYTES}; use a shorter one"
        )
