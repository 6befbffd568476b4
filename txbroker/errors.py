"""The SDK's errors: one class per error code of the HTTP contract (docs/api.md, "Error codes"), plus the
few errors the client itself raises.

    Exception
     └── TxbrokerError                       code, message, retriable, abortable, fatal
          ├── <one class per contract code>   e.g. ProducerFencedError (PRODUCER_FENCED)
          ├── TxbrokerConnectionError         the server could not be reached or the response was lost
          │    └── InvalidResponseError       an answer that is not the contract's (not JSON, a field
          │                                   missing or of another type, undecodable)
          ├── TxbrokerTimeoutError            a client deadline passed (the outcome may be unknown)
          ├── IllegalStateError               a call not allowed in the client's current state
          ├── TransactionAbortedError         a record's transaction was aborted before it was sent
          └── NoOffsetForPartitionError       no committed offset and auto_offset_reset="none"

Like Kafka's `Errors.java` (and aiokafka's `errors.py`), codes are stable and closed; `for_code(code)`
maps a code from a response body back to its class. The categories follow KIP-1050:

- `retriable`: the same request may succeed later (the SDK retries these itself, with backoff);
- `abortable`: the current transaction cannot commit, but aborting it and retrying is safe;
- `fatal`: the producer cannot continue (fenced, or sequence state lost); close it and make a new one.

A code's HTTP status and retriability are the wire's (txbroker/wire.py's ERROR_SPECS, which the server
uses too); its other categories are the client's, declared once, here. The producer may raise an
error with a stricter category than the default where the situation calls for it
(OUT_OF_ORDER_SEQUENCE_NUMBER is fatal for an idempotent producer and abortable in a transaction),
always through the same class.
"""

from __future__ import annotations

from typing import ClassVar

from txbroker.wire import ERROR_SPECS, ErrorCode


class TxbrokerError(Exception):
    """Base of every error the SDK raises. `code` is the contract's code (or a client code),
    `message` the server's human-readable text, saying what to do."""

    code: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    http_status: ClassVar[int | None] = None
    default_retriable: ClassVar[bool] = False
    default_abortable: ClassVar[bool] = False
    default_fatal: ClassVar[bool] = False

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retriable: bool | None = None,
        abortable: bool | None = None,
        fatal: bool | None = None,
        status: int | None = None,
    ) -> None:
        if code is not None:
            self.code = code  # an unknown code from a newer server keeps its name
        self.message = message
        self.retriable = self.default_retriable if retriable is None else retriable
        self.fatal = self.default_fatal if fatal is None else fatal
        self.abortable = (self.default_abortable if abortable is None else abortable) and not self.fatal
        self.status = status if status is not None else self.http_status
        super().__init__(f"{self.code}: {message}" if message else self.code)

    def with_category(self, *, abortable: bool | None = None, fatal: bool | None = None) -> TxbrokerError:
        """A copy of this error (same class, code and message, chained to it) in another category,
        and no longer retriable: what the producer raises when the situation decides the category."""
        copy = type(self)(
            self.message,
            code=self.code,
            retriable=False,
            abortable=self.abortable if abortable is None else abortable,
            fatal=self.fatal if fatal is None else fatal,
            status=self.status,
        )
        copy.__cause__ = self
        return copy

    def __reduce__(self):  # picklable (Spark ships exceptions between processes)
        return (
            _rebuild,
            (type(self), self.message, self.code, self.retriable, self.abortable, self.fatal, self.status),
        )


def _rebuild(cls, message, code, retriable, abortable, fatal, status):
    return cls(message, code=code, retriable=retriable, abortable=abortable, fatal=fatal, status=status)


def _error(
    name: str, code: ErrorCode, *, abortable: bool = False, fatal: bool = False, doc: str
) -> type[TxbrokerError]:
    """The class of a contract code, with the code's HTTP status and retriability from the wire's table."""
    spec = ERROR_SPECS[code]
    return type(
        name,
        (TxbrokerError,),
        {
            "code": code.value,
            "http_status": spec.http_status,
            "default_retriable": spec.retriable,
            "default_abortable": abortable,
            "default_fatal": fatal,
            "__doc__": doc,
            "__module__": __name__,
        },
    )


# ---- the contract's codes (docs/api.md, "Error codes"), one class each (status, retriability: wire.py)

InvalidRequestError = _error("InvalidRequestError", ErrorCode.INVALID_REQUEST, doc="malformed body or field")
InvalidTopicError = _error(
    "InvalidTopicError", ErrorCode.INVALID_TOPIC_EXCEPTION, abortable=True, doc="bad topic name, or an internal topic"
)
InvalidPartitionsError = _error("InvalidPartitionsError", ErrorCode.INVALID_PARTITIONS, doc="bad partition count")
InvalidRecordError = _error(
    "InvalidRecordError", ErrorCode.INVALID_RECORD, abortable=True, doc="a record the server cannot accept"
)
InvalidTransactionTimeoutError = _error(
    "InvalidTransactionTimeoutError",
    ErrorCode.INVALID_TRANSACTION_TIMEOUT,
    fatal=True,
    doc="transaction_timeout_ms outside the server's range",
)
RecordTooLargeError = _error(
    "RecordTooLargeError", ErrorCode.RECORD_TOO_LARGE, abortable=True, doc="a record over the topic's max_message_bytes"
)
InvalidConfigError = _error("InvalidConfigError", ErrorCode.INVALID_CONFIG, doc="unknown topic config key or bad value")
UnknownTopicOrPartitionError = _error(
    "UnknownTopicOrPartitionError",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    abortable=True,
    doc="no such topic or partition",
)
UnknownTopicIdError = _error(
    "UnknownTopicIdError",
    ErrorCode.UNKNOWN_TOPIC_ID,
    doc="no topic has this topic id any more (the Kafka listener's answer; HTTP names topics by name)",
)
TransactionalIdNotFoundError = _error(
    "TransactionalIdNotFoundError",
    ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
    doc="admin look-up of an unknown transactional id",
)
GroupIdNotFoundError = _error(
    "GroupIdNotFoundError", ErrorCode.GROUP_ID_NOT_FOUND, doc="describe or delete of an unknown group"
)
InvalidGroupIdError = _error(
    "InvalidGroupIdError",
    ErrorCode.INVALID_GROUP_ID,
    doc="a group id over the identifier limit, as the Kafka listener answers it (HTTP answers INVALID_REQUEST)",
)
OffsetMetadataTooLargeError = _error(
    "OffsetMetadataTooLargeError",
    ErrorCode.OFFSET_METADATA_TOO_LARGE,
    doc="an offset's metadata over 4096 characters, as the Kafka listener answers it (HTTP allows 100000)",
)
NotFoundError = _error("NotFoundError", ErrorCode.NOT_FOUND, doc="no such route")
MethodNotAllowedError = _error(
    "MethodNotAllowedError", ErrorCode.METHOD_NOT_ALLOWED, doc="no such method on this route"
)
TopicAlreadyExistsError = _error("TopicAlreadyExistsError", ErrorCode.TOPIC_ALREADY_EXISTS, doc="the topic exists")
ProducerFencedError = _error(
    "ProducerFencedError",
    ErrorCode.PRODUCER_FENCED,
    fatal=True,
    doc="a newer instance owns this transactional id (or the transaction timed out): close the producer",
)
InvalidProducerEpochError = _error(
    "InvalidProducerEpochError", ErrorCode.INVALID_PRODUCER_EPOCH, fatal=True, doc="a stale producer epoch"
)
InvalidProducerIdMappingError = _error(
    "InvalidProducerIdMappingError",
    ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    fatal=True,
    doc="the producer id is not this transactional id's (it expired, or was never initialized): create a new producer",
)
InvalidTxnStateError = _error(
    "InvalidTxnStateError",
    ErrorCode.INVALID_TXN_STATE,
    fatal=True,
    doc="the request is not allowed in the transaction's state",
)
OutOfOrderSequenceNumberError = _error(
    "OutOfOrderSequenceNumberError",
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    fatal=True,
    doc="a gap or reorder in sequence numbers: records may be lost",
)
UnknownProducerIdError = _error(
    "UnknownProducerIdError", ErrorCode.UNKNOWN_PRODUCER_ID, doc="the producer id was never issued or has expired"
)
IllegalGenerationError = _error(
    "IllegalGenerationError",
    ErrorCode.ILLEGAL_GENERATION,
    abortable=True,
    doc="the consumer's generation is stale: a rebalance happened",
)
UnknownMemberIdError = _error(
    "UnknownMemberIdError",
    ErrorCode.UNKNOWN_MEMBER_ID,
    abortable=True,
    doc="the consumer is not (or no longer) a member of the group",
)
ConcurrentTransactionsError = _error(
    "ConcurrentTransactionsError",
    ErrorCode.CONCURRENT_TRANSACTIONS,
    doc="the previous transaction is still completing",
)
RebalanceInProgressError = _error(
    "RebalanceInProgressError", ErrorCode.REBALANCE_IN_PROGRESS, doc="the group is rebalancing"
)
InconsistentGroupProtocolError = _error(
    "InconsistentGroupProtocolError",
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    doc="the group's members use the other door's protocol (Kafka's classic groups or HTTP's)",
)
FencedInstanceIdError = _error(
    "FencedInstanceIdError",
    ErrorCode.FENCED_INSTANCE_ID,
    doc="a newer member of the group joined with this member's group.instance.id (Kafka's static membership)",
)
StaleMemberEpochError = _error(
    "StaleMemberEpochError",
    ErrorCode.STALE_MEMBER_EPOCH,
    doc="a consumer group member (Kafka's group.protocol=consumer) committed or fetched with an epoch not its own",
)
FencedMemberEpochError = _error(
    "FencedMemberEpochError",
    ErrorCode.FENCED_MEMBER_EPOCH,
    doc="a consumer group member (Kafka's group.protocol=consumer) was fenced: it rejoins without its partitions",
)
UnsupportedAssignorError = _error(
    "UnsupportedAssignorError",
    ErrorCode.UNSUPPORTED_ASSIGNOR,
    doc="a consumer group member named a server assignor the broker does not have (group.remote.assignor)",
)
InvalidRegularExpressionError = _error(
    "InvalidRegularExpressionError",
    ErrorCode.INVALID_REGULAR_EXPRESSION,
    doc="a consumer group member subscribed with a regular expression that does not compile",
)
UnreleasedInstanceIdError = _error(
    "UnreleasedInstanceIdError",
    ErrorCode.UNRELEASED_INSTANCE_ID,
    doc="a consumer group member joined with a group.instance.id a member that has not left still has",
)
InvalidSessionTimeoutError = _error(
    "InvalidSessionTimeoutError",
    ErrorCode.INVALID_SESSION_TIMEOUT,
    doc="a Kafka JoinGroup's session timeout is outside the server's group_min/max_session_timeout_ms",
)
NonEmptyGroupError = _error(
    "NonEmptyGroupError",
    ErrorCode.NON_EMPTY_GROUP,
    doc="the group has members: it can be deleted only once they left (or their sessions expired)",
)
GroupSubscribedToTopicError = _error(
    "GroupSubscribedToTopicError",
    ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
    doc="a member of the group subscribes to the topic whose offsets were to be deleted",
)
UnstableOffsetCommitError = _error(
    "UnstableOffsetCommitError",
    ErrorCode.UNSTABLE_OFFSET_COMMIT,
    doc="a transactional offset commit awaits its transaction's outcome",
)
OffsetNotAdvancedError = _error(
    "OffsetNotAdvancedError",
    ErrorCode.OFFSET_NOT_ADVANCED,
    doc="a commit with require_advance found the partition's committed offset already at or past its own",
)
OffsetOutOfRangeError = _error("OffsetOutOfRangeError", ErrorCode.OFFSET_OUT_OF_RANGE, doc="offset outside the log")
PolicyViolationError = _error(
    "PolicyViolationError",
    ErrorCode.POLICY_VIOLATION,
    doc="the topic's config forbids it: records of a topic whose cleanup_policy lacks delete cannot be deleted",
)
OffsetNotAvailableError = _error(
    "OffsetNotAvailableError",
    ErrorCode.OFFSET_NOT_AVAILABLE,
    doc="the database's synchronous standby has not confirmed the offset yet (it is away); retried",
)
NotCoordinatorError = _error("NotCoordinatorError", ErrorCode.NOT_COORDINATOR, doc="ask /v1/coordinators/find again")
UnauthorizedError = _error(
    "UnauthorizedError", ErrorCode.UNAUTHORIZED, fatal=True, doc="missing or invalid credentials"
)
TopicAuthorizationFailedError = _error(
    "TopicAuthorizationFailedError",
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    abortable=True,
    doc="not allowed on this topic",
)
GroupAuthorizationFailedError = _error(
    "GroupAuthorizationFailedError",
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    abortable=True,
    doc="not allowed on this group",
)
ClusterAuthorizationFailedError = _error(
    "ClusterAuthorizationFailedError",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    doc="not allowed on the cluster (topic creation, admin operations)",
)
TransactionalIdAuthorizationFailedError = _error(
    "TransactionalIdAuthorizationFailedError",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    fatal=True,
    doc="not allowed on this transactional id",
)
CoordinatorLoadInProgressError = _error(
    "CoordinatorLoadInProgressError", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, doc="the server is starting"
)
CoordinatorNotAvailableError = _error(
    "CoordinatorNotAvailableError",
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    doc="the server's database is unavailable",
)
UnknownServerError = _error(
    "UnknownServerError",
    ErrorCode.UNKNOWN_SERVER_ERROR,
    doc="a bug in the server (its log has the request id)",
)

_BY_CODE: dict[str, type[TxbrokerError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        InvalidTopicError,
        InvalidPartitionsError,
        InvalidRecordError,
        InvalidTransactionTimeoutError,
        RecordTooLargeError,
        InvalidConfigError,
        UnknownTopicOrPartitionError,
        UnknownTopicIdError,
        TransactionalIdNotFoundError,
        GroupIdNotFoundError,
        InvalidGroupIdError,
        OffsetMetadataTooLargeError,
        NotFoundError,
        MethodNotAllowedError,
        TopicAlreadyExistsError,
        ProducerFencedError,
        InvalidProducerEpochError,
        InvalidProducerIdMappingError,
        InvalidTxnStateError,
        OutOfOrderSequenceNumberError,
        UnknownProducerIdError,
        IllegalGenerationError,
        UnknownMemberIdError,
        ConcurrentTransactionsError,
        RebalanceInProgressError,
        InconsistentGroupProtocolError,
        FencedInstanceIdError,
        StaleMemberEpochError,
        FencedMemberEpochError,
        UnsupportedAssignorError,
        InvalidRegularExpressionError,
        UnreleasedInstanceIdError,
        InvalidSessionTimeoutError,
        NonEmptyGroupError,
        GroupSubscribedToTopicError,
        UnstableOffsetCommitError,
        OffsetNotAdvancedError,
        OffsetOutOfRangeError,
        PolicyViolationError,
        OffsetNotAvailableError,
        NotCoordinatorError,
        UnauthorizedError,
        TopicAuthorizationFailedError,
        GroupAuthorizationFailedError,
        ClusterAuthorizationFailedError,
        TransactionalIdAuthorizationFailedError,
        CoordinatorLoadInProgressError,
        CoordinatorNotAvailableError,
        UnknownServerError,
    )
}

CONTRACT_CODES: frozenset[str] = frozenset(_BY_CODE)


# ---- errors of the client itself


class TxbrokerConnectionError(TxbrokerError):
    """The server could not be reached, or the connection broke before the response arrived: the
    request may or may not have been applied. Every state-changing request of the contract is safe
    to retry with the same body, which is what the SDK does."""

    code = "CONNECTION_ERROR"
    default_retriable = True


class InvalidResponseError(TxbrokerConnectionError):
    """An answer that is not the contract's: a 2xx whose body is not a JSON object (a proxy's or
    another server's page), a JSON object lacking a field the SDK reads or holding it with another
    JSON type (another version's, a proxy's; txbroker.connection.Answer), or a body that does not
    decode (its Content-Encoding corrupted on the way). Nothing in it says what the server did, so
    the request's outcome is unknown, as when the connection broke: retriable (the contract's
    requests are safe to retry, and a proxy's glitch passes); one that persists means `url` does
    not reach a txbroker server's API of a version this SDK speaks."""

    code = "INVALID_RESPONSE"


class TxbrokerTimeoutError(TxbrokerError):
    """A client-side deadline (max_block_ms, delivery_timeout_ms, default_api_timeout_ms) passed.
    For a commit, the transaction's outcome is not known yet: call commit_transaction() again to
    resume. (A RecordFuture's `result(timeout)` that runs out raises Python's TimeoutError, as any
    concurrent.futures.Future does: the record may still be delivered.)"""

    code = "TIMEOUT"
    default_retriable = True
    default_abortable = True


class IllegalStateError(TxbrokerError):
    """A method called in a state that does not allow it (begin_transaction twice, send outside a
    transaction, any call after a fatal error or close). A programming error, not a server answer."""

    code = "ILLEGAL_STATE"


class TransactionAbortedError(TxbrokerError):
    """The record was never sent: its transaction was aborted first."""

    code = "TRANSACTION_ABORTED"
    default_abortable = True


class NoOffsetForPartitionError(TxbrokerError):
    """No committed offset for a partition and auto_offset_reset="none"."""

    code = "NO_OFFSET_FOR_PARTITION"


_BY_CODE_ALL: dict[str, type[TxbrokerError]] = {
    **_BY_CODE,
    **{
        cls.code: cls
        for cls in (
            TxbrokerConnectionError,
            InvalidResponseError,
            TxbrokerTimeoutError,
            IllegalStateError,
            TransactionAbortedError,
            NoOffsetForPartitionError,
        )
    },
}


def for_code(code: str) -> type[TxbrokerError]:
    """The class of an error code; `TxbrokerError` itself for a code this SDK does not know (a newer
    server), so callers can still read `code` and `message`."""
    return _BY_CODE_ALL.get(code, TxbrokerError)


def from_body(error: dict, status: int | None = None) -> TxbrokerError:
    """The exception for a contract error object `{"code", "message", "retriable"}` (a response body's
    `error`, or a per-partition `error`)."""
    code = str(error.get("code", "UNKNOWN_SERVER_ERROR"))
    cls = for_code(code)
    retriable = error.get("retriable")
    if cls is TxbrokerError:
        return TxbrokerError(str(error.get("message", "")), code=code, retriable=bool(retriable), status=status)
    return cls(str(error.get("message", "")), retriable=None if retriable is None else bool(retriable), status=status)
