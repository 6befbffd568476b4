"""Request and response bodies of the HTTP contract (docs/api.md), declared once with the contract's words.

They are the OpenAPI document (/openapi.json, /docs) and the validation of every request: a body that
does not fit is a 400 INVALID_REQUEST naming the field. Validation is strict (a string is not an
integer, 1 is not true) because the contract says offsets and ids are JSON integers. Responses on the
hot paths are built as plain dicts and serialized with orjson; these models document their shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.coordinator.identifiers import MAX_IDENTIFIER_BYTES, check_identifier
from app.coordinator.produce import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE
from app.errors import BrokerError
from txbroker.wire import NO_LEADER_EPOCH

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1

Encoding = Literal["utf8", "base64"]
IsolationLevel = Literal["read_uncommitted", "read_committed"]

ProducerId = Annotated[int, Field(ge=NO_PRODUCER_ID, le=INT64_MAX, description="-1: no producer (a plain write)")]
ProducerEpoch = Annotated[int, Field(ge=NO_PRODUCER_EPOCH, le=INT16_MAX, description="-1: no producer")]
PartitionIndex = Annotated[int, Field(ge=0, le=INT32_MAX, description="partition index, from 0")]
Offset = Annotated[int, Field(ge=0, le=INT64_MAX, description="an offset in the partition")]
TopicName = Annotated[str, Field(description="topic name")]

# Identifiers are at most MAX_IDENTIFIER_BYTES in UTF-8 (app/coordinator/identifiers.py says why);
# an ACL rule's resource name is checked by the core's ACL addition, which the Kafka door shares.


def within_identifier_limit(value: str) -> str:
    """The core's identifier rule, as a pydantic validator's ValueError (answered 400 INVALID_REQUEST)."""
    try:
        check_identifier("the identifier", value)
    except BrokerError as error:
        raise ValueError(error.message) from None
    return value


def plain_json_object(body: bytes) -> dict | None:
    """The fast paths' parse: the body as a JSON object by orjson, or None (not JSON to orjson, which
    also refuses lone surrogates, or not an object): the general path then answers."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if parsed.__class__ is dict else None


def plain_int_in(value, low: int, high: int) -> bool:
    """The fast paths' check of an integer field (strict, as Body: no bool, no float)."""
    return value.__class__ is int and low <= value <= high


def plain_identifier(value) -> bool:
    """The fast paths' check of an Identifier, for a value orjson parsed (so no lone surrogate)."""
    return value.__class__ is str and value != "" and len(value.encode()) <= MAX_IDENTIFIER_BYTES


Identifier = Annotated[
    str,
    Field(min_length=1, description=f"at most {MAX_IDENTIFIER_BYTES} bytes in UTF-8"),
    AfterValidator(within_identifier_limit),
]
MemberId = Annotated[
    str, Field(description=f"at most {MAX_IDENTIFIER_BYTES} bytes in UTF-8"), AfterValidator(within_identifier_limit)
]
# The same limit for identifiers in a path (a group id, a transactional id, a principal, a key id).
IdentifierInPath = Annotated[str, AfterValidator(within_identifier_limit)]

ENCODING_FIELD = Field(
    "utf8",
    description=(
        "encoding of keys, values and header values: utf8 (the bytes are the UTF-8 of the string) "
        "or base64 (arbitrary bytes)"
    ),
)


class Body(BaseModel):
    model_config = ConfigDict(strict=True)


class ErrorObject(Body):
    code: str = Field(description="stable error code, e.g. PRODUCER_FENCED")
    message: str = Field(description="human readable: what was received, what was expected, what to do")
    retriable: bool = Field(description="whether the same request may succeed if retried")


class ErrorBody(Body):
    error: ErrorObject


class Header(Body):
    key: str = Field(max_length=1_000_000, description="header key (always text)")
    value: str | None = Field(None, description="header value, in the request's encoding")


class RecordIn(Body):
    key: str | None = Field(None, description="record key, in the request's encoding; null for none")
    value: str | None = Field(None, description="record value, in the request's encoding; null for none")
    headers: list[Header] = Field(default_factory=list, description="record headers")
    timestamp_ms: int | None = Field(
        None, ge=0, le=INT64_MAX, description="creation time in ms since the epoch; default: append time"
    )


class RecordOut(Body):
    offset: int
    key: str | None
    value: str | None
    headers: list[Header]
    timestamp_ms: int
    encoding: Encoding | None = Field(
        None, description="present (base64) when a utf8 fetch met bytes that are not UTF-8"
    )


# ---- topics


class CreateTopicRequest(Body):
    name: TopicName
    # None only when left out: the contract's type is int, so an explicit null is refused (400).
    partitions: int = Field(
        None,
        description="number of partitions, 1..10000; left out: the server's num_partitions (1 unless set)",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="retention_ms (-1 forever), retention_bytes (-1), max_message_bytes (1048576), "
        'cleanup_policy ("delete", "compact", "compact,delete" in either order, or "" for neither), '
        "delete_retention_ms "
        "(86400000: how long compaction keeps a tombstone); the server's log_* settings give "
        "the defaults of the ones left out",
    )


class CreatePartitionsRequest(Body):
    partitions: int = Field(
        description="the topic's partition count wanted (the total, as Kafka's CreatePartitions): more than "
        "it has now, at most 10000; the new partitions start empty"
    )


class PartitionInfo(Body):
    partition: int
    log_start_offset: int
    high_watermark: int = Field(description="the next offset to be written")
    last_stable_offset: int = Field(description="the first offset of the earliest open transaction, or the HW")


class TopicOut(Body):
    name: str
    topic_id: str = Field(
        description=(
            "Kafka's topic id (KIP-516) as Kafka's tools print it (URL-safe base64 of the 16 bytes, no padding): "
            "fixed for the topic's life, a new one when a topic of the name is re-created"
        )
    )
    partitions: list[PartitionInfo]
    config: dict[str, int | str]


class TopicList(Body):
    topics: list[TopicOut]


class DeleteRecordsPartition(Body):
    partition: PartitionIndex
    offset: int = Field(
        ge=-1,
        le=INT64_MAX,
        description=(
            "delete every record before this offset (it becomes the log start); -1: up to the high watermark. "
            "At most the last stable offset: an open transaction's records are never deleted"
        ),
    )


class DeleteRecordsRequest(Body):
    partitions: list[DeleteRecordsPartition] = Field(min_length=1)


class DeleteRecordsPartitionResult(Body):
    partition: int
    low_watermark: int = Field(description="the partition's log start offset now (-1 with an error)")
    error: ErrorObject | None


class DeleteRecordsResponse(Body):
    partitions: list[DeleteRecordsPartitionResult]


class ClusterNode(Body):
    node_id: int
    url: str


class Cluster(Body):
    node_id: int
    nodes: list[ClusterNode]
    topics: list[str]


class Health(Body):
    status: str
    database: str


# ---- produce


class ProducePartition(Body):
    topic: TopicName
    partition: PartitionIndex
    base_sequence: int = Field(
        NO_SEQUENCE,
        ge=NO_SEQUENCE,
        le=INT32_MAX,
        description="sequence number of the first record; -1 without a producer",
    )
    records: list[RecordIn] = Field(min_length=1, description="the records, at least one")


class ProduceRequest(Body):
    transactional_id: Identifier | None = Field(None, description="set for a transactional write")
    producer_id: ProducerId = NO_PRODUCER_ID
    producer_epoch: ProducerEpoch = NO_PRODUCER_EPOCH
    encoding: Encoding = ENCODING_FIELD
    partitions: list[ProducePartition] = Field(min_length=1, description="one entry per partition")


class ProducePartitionResult(Body):
    topic: str
    partition: int
    base_offset: int | None
    last_offset: int | None
    duplicate: bool = Field(description="true when this batch was already appended (idempotent retry)")
    error: ErrorObject | None


class ProduceResponse(Body):
    partitions: list[ProducePartitionResult]


class TopicRecordsRequest(Body):
    encoding: Encoding = ENCODING_FIELD
    partition: PartitionIndex | None = Field(
        None, description="null: chosen by murmur2 of the key (Kafka's default partitioner); null keys round-robin"
    )
    records: list[RecordIn] = Field(min_length=1)


# ---- fetch


class FetchPartition(Body):
    topic: TopicName
    partition: PartitionIndex
    offset: Offset


class FetchRequest(Body):
    isolation_level: IsolationLevel = "read_committed"
    max_wait_ms: int = Field(0, ge=0, le=30_000, description="long-poll up to this long for a record")
    max_records: int = Field(500, ge=1, le=10_000, description="at most this many records in all")
    encoding: Encoding = ENCODING_FIELD
    partitions: list[FetchPartition] = Field(min_length=1)


class FetchPartitionResult(Body):
    topic: str
    partition: int
    error: ErrorObject | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    next_offset: int = Field(description="where the next fetch continues (past markers and aborted records)")
    records: list[RecordOut]


class FetchResponse(Body):
    partitions: list[FetchPartitionResult]


class ListOffsetsPartition(Body):
    topic: TopicName
    partition: PartitionIndex
    timestamp: int = Field(
        -1,
        ge=-3,
        le=INT64_MAX,
        description="-1 latest, -2 earliest, -3 the record with the highest timestamp (KIP-734), or a time in ms",
    )


class ListOffsetsRequest(Body):
    isolation_level: IsolationLevel = "read_committed"
    partitions: list[ListOffsetsPartition] = Field(min_length=1)


class ListOffsetsPartitionResult(Body):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    error: ErrorObject | None


class ListOffsetsResponse(Body):
    partitions: list[ListOffsetsPartitionResult]


# ---- transactions

TransactionalId = Annotated[Identifier, Field(description="the transactional id")]


class FindCoordinatorRequest(Body):
    key_type: Literal["transaction", "group"] = "transaction"
    key: MemberId = Field(description="transactional id or group id")


class FindCoordinatorResponse(Body):
    key: str
    node_id: int
    url: str


class InitProducerIdRequest(Body):
    transactional_id: TransactionalId | None = None
    transaction_timeout_ms: int = Field(
        60_000,
        ge=-INT32_MAX,
        le=INT32_MAX,
        description="1..transaction_max_timeout_ms; checked with a transactional id",
    )
    producer_id: ProducerId = -1
    producer_epoch: ProducerEpoch = -1
    keep_prepared_txn: bool = Field(False, description="KIP-939: keep a Prepared transaction for this caller")


class ProducerIdAndEpochBody(Body):
    producer_id: int
    producer_epoch: int


class InitProducerIdResponse(Body):
    producer_id: int
    producer_epoch: int
    prepared: ProducerIdAndEpochBody | None = Field(
        None, description="with keep_prepared_txn: what the Prepared transaction was prepared with, or null"
    )


class TxnProducer(Body):
    transactional_id: TransactionalId
    producer_id: Annotated[int, Field(ge=0, le=INT64_MAX)]
    producer_epoch: Annotated[int, Field(ge=0, le=INT16_MAX)]


class TopicPartitionRef(Body):
    topic: TopicName
    partition: PartitionIndex


class AddPartitionsRequest(TxnProducer):
    partitions: list[TopicPartitionRef] = Field(min_length=1)


class PartitionError(Body):
    topic: str
    partition: int
    error: ErrorObject | None


class AddPartitionsResponse(Body):
    partitions: list[PartitionError]


class AddOffsetsRequest(TxnProducer):
    group_id: Identifier


class EndTxnRequest(TxnProducer):
    committed: bool = Field(description="true to commit, false to abort")


class EndTxnResponse(Body):
    producer_id: int = Field(description="the producer id the next transaction must use")
    producer_epoch: int = Field(description="the epoch the next transaction must use")
    state: str


class TransactionOut(Body):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    start_time_ms: int = Field(description="-1 without an open transaction")
    last_update_ms: int
    partitions: list[TopicPartitionRef]
    groups: list[str]
    transaction_version: int | None = Field(
        description="how the last EndTxn ended a transaction: 1 (classic: the epoch carries over, Kafka's EndTxn "
        "below v5) or 2 (KIP-890: the epoch is bumped, HTTP and Kafka's EndTxn v5+); null until an EndTxn ends "
        "one of the id's transactions (an abort by timeout, by an operator or by InitProducerId sets none)"
    )


class TransactionList(Body):
    transactions: list[TransactionOut]


class ProducerOut(Body):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    current_txn_start_offset: int = Field(description="-1: none")


class ProducerList(Body):
    producers: list[ProducerOut]


class MarkerOut(Body):
    offset: int
    producer_id: int
    producer_epoch: int
    type: Literal["COMMIT", "ABORT"]
    timestamp_ms: int


class MarkerList(Body):
    markers: list[MarkerOut]


# ---- consumer groups and offsets

GroupIdField = Identifier


class OffsetIn(Body):
    topic: TopicName
    partition: PartitionIndex
    offset: Offset
    metadata: str | None = Field(None, max_length=100_000, description="free text stored with the offset")
    leader_epoch: int = Field(
        NO_LEADER_EPOCH,
        ge=NO_LEADER_EPOCH,
        le=INT32_MAX,
        description="the leader epoch stored with the offset (Kafka's committed leader epoch); -1: none",
    )


class TxnOffsetCommitRequest(TxnProducer):
    group_id: GroupIdField
    generation_id: int = Field(
        -1, ge=-1, le=INT32_MAX, description=">= 0: the member and generation are checked (KIP-447 zombie fencing)"
    )
    member_id: MemberId = ""
    offsets: list[OffsetIn] = Field(min_length=1)


class OffsetsResult(Body):
    offsets: list[PartitionError]


class HeartbeatRequest(Body):
    member_id: MemberId = Field("", description='"" to join')
    join_id: Identifier | None = Field(
        None,
        description='with member_id "" only: a value the client makes unique per join (a UUID) and sends again '
        "when it repeats the join (its answer lost): every attempt then joins as the same member",
    )
    generation_id: int = Field(
        -1,
        ge=-1,
        le=INT32_MAX,
        description="the generation whose revocations this member has finished (its pre-revocation commits "
        "made): the partitions it gave up go to their next owners; -1: none",
    )
    topics: list[TopicName] = Field(default_factory=list, max_length=10_000, description="subscribed topics")
    session_timeout_ms: int = Field(
        30_000, ge=1_000, le=3_600_000, description="evicted when no heartbeat arrives for this long"
    )
    rebalance_timeout_ms: int | None = Field(
        None,
        ge=0,
        le=INT32_MAX,
        description="how long this member may take to revoke a partition (acknowledge the generation that "
        "revoked it) before the partition goes to its next owner all the same; 0: at once (no barrier); "
        "absent: session_timeout_ms",
    )


class AssignedTopic(Body):
    topic: str
    topic_id: str = Field(
        description="Kafka's topic id (KIP-516): another one when the topic was deleted and re-created under its "
        "name, whose partitions start again from the group's committed offsets"
    )
    partitions: list[int]


class HeartbeatResponse(Body):
    member_id: str
    generation_id: int
    heartbeat_interval_ms: int
    assignment: list[AssignedTopic]


class LeaveRequest(Body):
    member_id: Annotated[MemberId, Field(min_length=1)]


class OffsetCommitRequest(Body):
    member_id: MemberId = ""
    generation_id: int = Field(-1, ge=-1, le=INT32_MAX, description="-1: a simple commit, no membership check")
    offsets: list[OffsetIn] = Field(min_length=1)
    require_advance: bool = Field(
        False,
        description="each offset is written only past its partition's committed one (or where none is), else "
        "OFFSET_NOT_ADVANCED: the first commit of an offset wins; the very commit already there, repeated, is "
        "answered as written",
    )


class OffsetFetchRequest(Body):
    partitions: list[TopicPartitionRef] | None = Field(None, description="null: every committed partition")
    require_stable: bool = Field(False, description="UNSTABLE_OFFSET_COMMIT while a transactional offset is pending")


class OffsetDeleteRequest(Body):
    partitions: list[TopicPartitionRef] = Field(
        min_length=1, description="the partitions whose committed (and pending transactional) offsets go"
    )


class CommittedOffsetOut(Body):
    topic: str
    partition: int
    offset: int = Field(description="-1: none")
    metadata: str | None
    leader_epoch: int = Field(description="the leader epoch committed with the offset; -1: none")
    error: ErrorObject | None


class OffsetFetchResponse(Body):
    offsets: list[CommittedOffsetOut]


# ---- security

PrincipalName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9._@-]+$",
        description="principal name ([A-Za-z0-9._@-], 1..256)",
    ),
]


class PrincipalIn(Body):
    name: PrincipalName
    super_user: bool = Field(False, description="super users may do everything")


class PrincipalOut(Body):
    name: str
    super_user: bool
    created_ms: int


class ApiKeyCreated(Body):
    key_id: str
    token: str = Field(description="the bearer token; shown once, stored only as a hash")


class ApiKeyOut(Body):
    key_id: str
    created_ms: int
    revoked_ms: int | None


class AclIn(Body):
    principal: Annotated[str, Field(min_length=1, max_length=256, description='a principal name, or "*" for all')]
    resource_type: Literal["Topic", "Group", "TransactionalId", "Cluster"]
    pattern_type: Literal["literal", "prefixed"] = "literal"
    resource_name: Annotated[
        str,
        Field(
            min_length=1,
            description=f'literal name ("*" for every), or a prefix; at most {MAX_IDENTIFIER_BYTES} bytes in UTF-8',
        ),
    ]
    operation: Literal["Read", "Write", "Create", "Delete", "Describe", "Alter", "All"]
    permission: Literal["allow", "deny"] = "allow"


class AclOut(AclIn):
    acl_id: int


class ScramCredentialIn(Body):
    password: str = Field(description="the password SCRAM clients will authenticate with; never stored")
    iterations: int = Field(4096, description="PBKDF2 iterations, 4096..16384 (Kafka's bounds)")


class ScramCredentialOut(Body):
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]
    iterations: int
    updated_ms: int


class ScramCredentialList(Body):
    credentials: list[ScramCredentialOut]


class PrincipalList(Body):
    principals: list[PrincipalOut]


class ApiKeyList(Body):
    keys: list[ApiKeyOut]


class AclList(Body):
    acls: list[AclOut]
