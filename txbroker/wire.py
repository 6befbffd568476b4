"""The facts of the wire that the server (app/) and the SDK must agree on, declared once: the error
registry, the sentinels of the HTTP contract, the control record types and Kafka's default
partitioner. Both sides import them from here, so they cannot drift apart.

Standard library only: the client distribution installs with httpx alone, and the server imports
this module as it imports the rest of the SDK's names it shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

# ---- sentinels of the contract's fields

NO_PRODUCER_ID = -1  # a plain write: no producer, no sequence checks
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
# A producer's sequence numbers per partition run from 0 to Int.MaxValue and then wrap to 0, as
# Kafka's (DefaultRecordBatch.incrementSequence): a batch may start near the top and end past 0.
SEQUENCE_MODULUS = 2**31
NO_OFFSET = -1  # no offset (none committed, none found for a timestamp, an unknown partition's)
NO_TIMESTAMP = -1
NO_GENERATION = -1  # an offset commit outside any group generation
NO_LEADER_EPOCH = -1  # a committed offset without a leader epoch (Kafka's sentinel)
NO_MEMBER = ""  # a consumer that has not joined its group yet

# ListOffsets' special timestamps, as Kafka's.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)  # the server's default first

# Control record types, as Kafka's ControlRecordType.
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


# ---- the error registry


class ErrorCode(StrEnum):
    """The closed registry of the contract's error codes. Like Kafka's `Errors.java`, a code's name,
    HTTP status and retriability (ERROR_SPECS) never change meaning: clients act on them."""

    INVALID_REQUEST = "INVALID_REQUEST"
    INVALID_TOPIC_EXCEPTION = "INVALID_TOPIC_EXCEPTION"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_RECORD = "INVALID_RECORD"
    INVALID_TRANSACTION_TIMEOUT = "INVALID_TRANSACTION_TIMEOUT"
    RECORD_TOO_LARGE = "RECORD_TOO_LARGE"
    INVALID_CONFIG = "INVALID_CONFIG"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    UNKNOWN_TOPIC_ID = "UNKNOWN_TOPIC_ID"
    TRANSACTIONAL_ID_NOT_FOUND = "TRANSACTIONAL_ID_NOT_FOUND"
    GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
    # Kafka's answer for a group id its coordinator refuses: the Kafka listener's, for one over the
    # identifier limit (HTTP's schemas answer INVALID_REQUEST for it first).
    INVALID_GROUP_ID = "INVALID_GROUP_ID"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    TOPIC_ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
    PRODUCER_FENCED = "PRODUCER_FENCED"
    INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"
    INVALID_PRODUCER_ID_MAPPING = "INVALID_PRODUCER_ID_MAPPING"
    INVALID_TXN_STATE = "INVALID_TXN_STATE"
    OUT_OF_ORDER_SEQUENCE_NUMBER = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    UNKNOWN_PRODUCER_ID = "UNKNOWN_PRODUCER_ID"
    ILLEGAL_GENERATION = "ILLEGAL_GENERATION"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    CONCURRENT_TRANSACTIONS = "CONCURRENT_TRANSACTIONS"
    REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
    # A member of the other door's kind joining a group (Kafka's classic protocol vs HTTP's heartbeat).
    INCONSISTENT_GROUP_PROTOCOL = "INCONSISTENT_GROUP_PROTOCOL"
    # Kafka's static membership (KIP-345): a newer member took this member's group.instance.id.
    FENCED_INSTANCE_ID = "FENCED_INSTANCE_ID"
    # KIP-848's consumer groups (Kafka listener, ConsumerGroupHeartbeat): a member's epoch that is not
    # its current one on a commit or fetch (STALE: heartbeat, then retry), or on a heartbeat (FENCED:
    # rejoin); a server assignor the broker does not have.
    STALE_MEMBER_EPOCH = "STALE_MEMBER_EPOCH"
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    UNSUPPORTED_ASSIGNOR = "UNSUPPORTED_ASSIGNOR"
    # ... and a subscription's regular expression that does not compile.
    INVALID_REGULAR_EXPRESSION = "INVALID_REGULAR_EXPRESSION"
    # ... and a static member joining while its instance id's member has not left.
    UNRELEASED_INSTANCE_ID = "UNRELEASED_INSTANCE_ID"
    # Kafka's group.min/max.session.timeout.ms: a JoinGroup's session timeout outside the server's bounds.
    INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
    # Kafka's DeleteGroups: a group with members cannot be deleted.
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
    # Kafka's OffsetDelete: a member of the group subscribes to the topic whose offsets were to go.
    GROUP_SUBSCRIBED_TO_TOPIC = "GROUP_SUBSCRIBED_TO_TOPIC"
    UNSTABLE_OFFSET_COMMIT = "UNSTABLE_OFFSET_COMMIT"
    # HTTP's OffsetCommit with require_advance (Kafka has no such commit): the partition's committed
    # offset is already at or past the one sent, so the first commit of an offset wins.
    OFFSET_NOT_ADVANCED = "OFFSET_NOT_ADVANCED"
    # Kafka's offset.metadata.max.bytes: an offset's metadata over 4096 characters (Kafka listener).
    OFFSET_METADATA_TOO_LARGE = "OFFSET_METADATA_TOO_LARGE"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    # Kafka's code 44: a request the topic's config forbids (DeleteRecords of a topic whose
    # cleanup.policy lacks delete).
    POLICY_VIOLATION = "POLICY_VIOLATION"
    # Kafka's code 78: an offset the synchronous standby has not confirmed yet (ListOffsets).
    OFFSET_NOT_AVAILABLE = "OFFSET_NOT_AVAILABLE"
    NOT_COORDINATOR = "NOT_COORDINATOR"
    UNAUTHORIZED = "UNAUTHORIZED"
    TOPIC_AUTHORIZATION_FAILED = "TOPIC_AUTHORIZATION_FAILED"
    GROUP_AUTHORIZATION_FAILED = "GROUP_AUTHORIZATION_FAILED"
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    # Added to the contract's table (as Kafka has it): denials of cluster-level operations.
    CLUSTER_AUTHORIZATION_FAILED = "CLUSTER_AUTHORIZATION_FAILED"
    COORDINATOR_LOAD_IN_PROGRESS = "COORDINATOR_LOAD_IN_PROGRESS"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    http_status: int
    retriable: bool
    about: str


# The contract's table, one row per code. The HTTP status and retriability of a code never change.
ERROR_SPECS: MappingProxyType[ErrorCode, ErrorSpec] = MappingProxyType(
    {
        ErrorCode.INVALID_REQUEST: ErrorSpec(400, False, "malformed body or field"),
        ErrorCode.INVALID_TOPIC_EXCEPTION: ErrorSpec(400, False, "bad topic name, or an internal topic"),
        ErrorCode.INVALID_PARTITIONS: ErrorSpec(400, False, "bad partition count"),
        ErrorCode.INVALID_RECORD: ErrorSpec(400, False, "a record the server cannot accept"),
        ErrorCode.INVALID_TRANSACTION_TIMEOUT: ErrorSpec(400, False, "timeout outside the allowed range"),
        ErrorCode.RECORD_TOO_LARGE: ErrorSpec(413, False, "over max_message_bytes"),
        ErrorCode.INVALID_CONFIG: ErrorSpec(400, False, "unknown topic config key or bad value"),
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorSpec(404, False, "no such topic or partition"),
        ErrorCode.UNKNOWN_TOPIC_ID: ErrorSpec(404, False, "no topic has this topic id (any more)"),
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: ErrorSpec(404, False, "admin look-up of an unknown id"),
        ErrorCode.GROUP_ID_NOT_FOUND: ErrorSpec(404, False, "describe or delete of an unknown group"),
        ErrorCode.INVALID_GROUP_ID: ErrorSpec(400, False, "a group id over the identifier limit (Kafka listener)"),
        ErrorCode.NOT_FOUND: ErrorSpec(404, False, "no such route"),
        ErrorCode.METHOD_NOT_ALLOWED: ErrorSpec(405, False, "no such method on this route"),
        ErrorCode.TOPIC_ALREADY_EXISTS: ErrorSpec(409, False, "the topic exists"),
        ErrorCode.PRODUCER_FENCED: ErrorSpec(409, False, "a newer instance owns this transactional id"),
        ErrorCode.INVALID_PRODUCER_EPOCH: ErrorSpec(409, False, "stale epoch"),
        ErrorCode.INVALID_PRODUCER_ID_MAPPING: ErrorSpec(409, False, "producer id not of this transactional id"),
        ErrorCode.INVALID_TXN_STATE: ErrorSpec(409, False, "not allowed in the transaction's state"),
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorSpec(409, False, "a gap or reorder in sequences"),
        ErrorCode.UNKNOWN_PRODUCER_ID: ErrorSpec(409, False, "producer id never issued or expired"),
        ErrorCode.ILLEGAL_GENERATION: ErrorSpec(409, False, "zombie consumer fenced"),
        ErrorCode.UNKNOWN_MEMBER_ID: ErrorSpec(409, False, "zombie consumer fenced"),
        ErrorCode.CONCURRENT_TRANSACTIONS: ErrorSpec(409, True, "previous transaction still completing"),
        ErrorCode.REBALANCE_IN_PROGRESS: ErrorSpec(409, True, "retry after re-reading state"),
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL: ErrorSpec(409, False, "the group's members use another protocol"),
        ErrorCode.FENCED_INSTANCE_ID: ErrorSpec(409, False, "a newer member has this group instance id"),
        ErrorCode.STALE_MEMBER_EPOCH: ErrorSpec(409, False, "a consumer group member's epoch is not its current one"),
        ErrorCode.FENCED_MEMBER_EPOCH: ErrorSpec(409, False, "a consumer group member was fenced: rejoin"),
        ErrorCode.UNSUPPORTED_ASSIGNOR: ErrorSpec(400, False, "a server assignor the broker does not have"),
        ErrorCode.INVALID_REGULAR_EXPRESSION: ErrorSpec(400, False, "a subscription's regex does not compile"),
        ErrorCode.UNRELEASED_INSTANCE_ID: ErrorSpec(409, False, "a live member still has this group instance id"),
        ErrorCode.INVALID_SESSION_TIMEOUT: ErrorSpec(400, False, "session timeout outside the server's bounds"),
        ErrorCode.NON_EMPTY_GROUP: ErrorSpec(409, False, "the group has members: it cannot be deleted"),
        ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC: ErrorSpec(409, False, "a member subscribes to the topic"),
        ErrorCode.UNSTABLE_OFFSET_COMMIT: ErrorSpec(409, True, "a transactional offset is pending"),
        ErrorCode.OFFSET_NOT_ADVANCED: ErrorSpec(409, False, "the committed offset is already at or past it"),
        ErrorCode.OFFSET_METADATA_TOO_LARGE: ErrorSpec(
            400, False, "an offset's metadata over 4096 characters (Kafka listener)"
        ),
        ErrorCode.OFFSET_OUT_OF_RANGE: ErrorSpec(416, False, "offset outside the log"),
        ErrorCode.POLICY_VIOLATION: ErrorSpec(409, False, "the topic's cleanup policy forbids it"),
        ErrorCode.OFFSET_NOT_AVAILABLE: ErrorSpec(503, True, "the synchronous standby has not confirmed it yet; retry"),
        ErrorCode.NOT_COORDINATOR: ErrorSpec(421, True, "ask /v1/coordinators/find again"),
        ErrorCode.UNAUTHORIZED: ErrorSpec(401, False, "missing or invalid credentials"),
        ErrorCode.TOPIC_AUTHORIZATION_FAILED: ErrorSpec(403, False, "not allowed on this topic"),
        ErrorCode.GROUP_AUTHORIZATION_FAILED: ErrorSpec(403, False, "not allowed on this group"),
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ErrorSpec(403, False, "not allowed on this transactional id"),
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED: ErrorSpec(403, False, "not allowed on the cluster"),
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: ErrorSpec(503, True, "the server is starting; retry"),
        ErrorCode.COORDINATOR_NOT_AVAILABLE: ErrorSpec(503, True, "the database is unavailable; retry"),
        ErrorCode.UNKNOWN_SERVER_ERROR: ErrorSpec(500, True, "a bug in the server"),
    }
)


# ---- Kafka's default partitioner: murmur2 of the key bytes, made positive, modulo the partition count.
# The SDK partitions with it and so does the server's convenience endpoint (POST
# /v1/topics/{topic}/records): a key lands on the same partition whichever way it was written, and on
# the same partition as with Kafka's Java client.

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[full + 2] << 16
    if tail >= 2:
        h ^= data[full + 1] << 8
    if tail >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partition_count: int) -> int:
    """Kafka's `toPositive(murmur2(key)) % numPartitions`."""
    return (murmur2(key) & 0x7FFFFFFF) % partition_count
