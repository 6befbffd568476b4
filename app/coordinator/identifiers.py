"""The longest identifier the server stores (transactional id, group id, member id, an ACL rule's
principal and resource name, key id), in UTF-8 bytes, for both front doors. PostgreSQL indexes
them, and an index row holds at most about 2.7 kB, shared in some indexes by two identifiers (group
id and member id; principal and resource name): a longer one would fail its statement instead of
being refused with a message.

HTTP's schemas refuse a longer identifier first (400 INVALID_REQUEST); the core's operations check
the ones the Kafka listener hands them, each rule once here, with the error Kafka's coordinators
answer for an id they find invalid: INVALID_GROUP_ID for a group id (GroupCoordinator's
validateGroupStatus, on every group API, look-ups included; the empty one too on the APIs Kafka
refuses it on, `check_member_group_id`), INVALID_REQUEST for a transactional id
(TransactionCoordinator, InitProducerId to EndTxn, and DescribeTransactions)."""

from __future__ import annotations

from app.errors import BrokerError, ErrorCode

MAX_IDENTIFIER_BYTES = 1024


# A character is at most 4 bytes in UTF-8: an identifier of this many characters is within the limit
# without being encoded (the checks sit on hot paths, and nearly every identifier is this short).
_SURELY_WITHIN_CHARACTERS = MAX_IDENTIFIER_BYTES // 4


def identifier_bytes(value: str) -> int:
    """The identifier's length as stored: UTF-8 (a lone surrogate counted as its 3 bytes)."""
    return len(value.encode("utf-8", "surrogatepass"))


def check_identifier(what: str, value: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
    """Raises `code` (INVALID_REQUEST unless told), naming `what`, for an identifier over
    MAX_IDENTIFIER_BYTES."""
    if len(value) <= _SURELY_WITHIN_CHARACTERS:
        return
    size = identifier_bytes(value)
    if size > MAX_IDENTIFIER_BYTES:
        raise BrokerError(
            code, f"{what} is {size} bytes in UTF-8: expected at most {MAX_IDENTIFIER_BYTES}; use a shorter one"
        )


def check_group_id(group_id: str) -> None:
    """INVALID_GROUP_ID for a group id over the limit: no group can have it."""
    check_identifier("the group id", group_id, ErrorCode.INVALID_GROUP_ID)


def check_member_group_id(group_id: str) -> None:
    """check_group_id, and INVALID_GROUP_ID for the empty group id too: Kafka's group coordinator
    (GroupCoordinatorService) refuses it on the APIs of a group's members (JoinGroup, SyncGroup,
    Heartbeat, LeaveGroup) and on TxnOffsetCommit and OffsetDelete, where OffsetCommit, OffsetFetch,
    DescribeGroups and DeleteGroups take "" as any other id (only a null one is invalid there)."""
    if not group_id:
        raise BrokerError(
            ErrorCode.INVALID_GROUP_ID,
            f"the group id is empty: expected 1 to {MAX_IDENTIFIER_BYTES} bytes in UTF-8; give the consumer a group.id",
        )
    check_group_id(group_id)


def check_transactional_id(transactional_id: str) -> None:
    """INVALID_REQUEST for a transactional id over the limit: no transaction can have it."""
    check_identifier("the transactional id", transactional_id)


def within_limit(prefix: str, suffix: str) -> str:
    """`prefix + suffix` cut short in `prefix` (at a character) to fit MAX_IDENTIFIER_BYTES: an id
    the server makes from a client's text (a member id from its client id) is always storable."""
    room = MAX_IDENTIFIER_BYTES - identifier_bytes(suffix)
    encoded = prefix.encode("utf-8", "surrogatepass")
    if len(encoded) > room:
        prefix = encoded[:room].decode("utf-8", "ignore")
    return prefix + suffix
