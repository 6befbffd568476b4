"""The SDK's errors: one class per error code of the HTTP contract (docs/api.md, "Error codes"), plus the
few errors the client itself raises.

    Exception
     └── TxbrokerError                       code, message, retriable, abortable, fatal
          ├── <one class per contract code>   e.g. ProducerFencedError (PRODUCER_FENCED)
          ├── TxbrokerConnectionError         the server could not be reached or the response was lost
          ├── TxbrokerTimeoutError            a client deadline passed (the outcome may be unknown)
          ├── IllegalStateError               a call not allowed in the client's current state
          ├── TransactionAbortedError         a record's transaction was aborted before it was sent
          └── NoOffsetForPartitionError       no committed offset and auto_offset_reset="none"

Like Kafka's `Errors.java` (and aiokafka's `errors.py`), codes are stable and closed; `for_code(code)`
maps a code from a response body back to its class. The categories follow KIP-1050:

- `retriable`: the same request may succeed later (the SDK retries these itself, with backoff);
- `abortable`: the current transaction cannot commit, but aborting it and retrying is safe;
- `fatal`: the producer cannot continue (fenced, or sequence state lost); close it and make a new one.

A code's default category is declared once, here. The producer may raise an error with a stricter
category than the default where the situation calls for it (OUT_OF_ORDER_SEQUENCE_NUMBER is fatal
for an idempotent producer and abortable in a transaction), always through the same class.
"""

from __future__ import annotations

from typing import ClassVar


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
    name: str,
    code: str,
    status: int,
    *,
    retriable: bool = False,
    abortable: bool = False,
    fatal: bool = False,
    doc: str,
) -> type[TxbrokerError]:
    return type(
        name,
        (TxbrokerError,),
        {
            "code": code,
            "http_status": status,
            "default_retriable": retriable,
            "default_abortable": abortable,
            "default_fatal": fatal,
            "__doc__": doc,
            "__module__": __name__,
        },
    )


# ---- the contract's codes, one row each (docs/api.md, "Error codes")

InvalidRequestError = _error("InvalidRequestError", "INVALID_REQUEST", 400, doc="malformed body or field")
InvalidTopicError = _error(
    "InvalidTopicError", "INVALID_TOPIC_EXCEPTION", 400, abortable=True, doc="bad topic name, or an internal topic"
)
InvalidPartitionsError = _error("InvalidPartitionsError", "INVALID_PARTITIONS", 400, doc="bad partition count")
InvalidRecordError = _error(
    "InvalidRecordError", "INVALID_RECORD", 400, abortable=True, doc="a record the server cannot accept"
)
InvalidTransactionTimeoutError = _error(
    "InvalidTransactionTimeoutError",
    "INVALID_TRANSACTION_TIMEOUT",
    400,
    fatal=True,
    doc="transaction_timeout_ms outside the server's range",
)
RecordTooLargeError = _error(
    "RecordTooLargeError", "RECORD_TOO_LARGE", 413, abortable=True, doc="a record over the topic's max_message_bytes"
)
InvalidConfigError = _error("InvalidConfigError", "INVALID_CONFIG", 400, doc="unknown topic config key or bad value")
UnknownTopicOrPartitionError = _error(
    "UnknownTopicOrPartitionError", "UNKNOWN_TOPIC_OR_PARTITION", 404, abortable=True, doc="no such topic or partition"
)
TransactionalIdNotFoundError = _error(
    "TransactionalIdNotFoundError",
    "TRANSACTIONAL_ID_NOT_FOUND",
    404,
    doc="admin look-up of an unknown transactional id",
)
GroupIdNotFoundError = _error("GroupIdNotFoundError", "GROUP_ID_NOT_FOUND", 404, doc="describe of an unknown group")
NotFoundError = _error("NotFoundError", "NOT_FOUND", 404, doc="no such route")
MethodNotAllowedError = _error("MethodNotAllowedError", "METHOD_NOT_ALLOWED", 405, doc="no such method on this route")
TopicAlreadyExistsError = _error("TopicAlreadyExistsError", "TOPIC_ALREADY_EXISTS", 409, doc="the topic exists")
ProducerFencedError = _error(
    "ProducerFencedError",
    "PRODUCER_FENCED",
    409,
    fatal=True,
    doc="a newer instance owns this transactional id (or the transaction timed out): close the producer",
)
InvalidProducerEpochError = _error(
    "InvalidProducerEpochError", "INVALID_PRODUCER_EPOCH", 409, fatal=True, doc="a stale producer epoch"
)
InvalidProducerIdMappingError = _error(
    "InvalidProducerIdMappingError",
    "INVALID_PRODUCER_ID_MAPPING",
    409,
    fatal=True,
    doc="the producer id is not this transactional id's (it expired, or was never initialized): create a new producer",
)
InvalidTxnStateError = _error(
    "InvalidTxnStateError",
    "INVALID_TXN_STATE",
    409,
    fatal=True,
    doc="the request is not allowed in the transaction's state",
)
OutOfOrderSequenceNumberError = _error(
    "OutOfOrderSequenceNumberError",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    409,
    fatal=True,
    doc="a gap or reorder in sequence numbers: records may be lost",
)
UnknownProducerIdError = _error(
    "UnknownProducerIdError", "UNKNOWN_PRODUCER_ID", 409, doc="the producer id was never issued or has expired"
)
IllegalGenerationError = _error(
    "IllegalGenerationError",
    "ILLEGAL_GENERATION",
    409,
    abortable=True,
    doc="the consumer's generation is stale: a rebalance happened",
)
UnknownMemberIdError = _error(
    "UnknownMemberIdError",
    "UNKNOWN_MEMBER_ID",
    409,
    abortable=True,
    doc="the consumer is not (or no longer) a member of the group",
)
ConcurrentTransactionsError = _error(
    "ConcurrentTransactionsError",
    "CONCURRENT_TRANSACTIONS",
    409,
    retriable=True,
    doc="the previous transaction is still completing",
)
RebalanceInProgressError = _error(
    "RebalanceInProgressError", "REBALANCE_IN_PROGRESS", 409, retriable=True, doc="the group is rebalancing"
)
UnstableOffsetCommitError = _error(
    "UnstableOffsetCommitError",
    "UNSTABLE_OFFSET_COMMIT",
    409,
    retriable=True,
    doc="a transactional offset commit awaits its transaction's outcome",
)
OffsetOutOfRangeError = _error("OffsetOutOfRangeError", "OFFSET_OUT_OF_RANGE", 416, doc="offset outside the log")
NotCoordinatorError = _error(
    "NotCoordinatorError", "NOT_COORDINATOR", 421, retriable=True, doc="ask /v1/coordinators/find again"
)
UnauthorizedError = _error("UnauthorizedError", "UNAUTHORIZED", 401, fatal=True, doc="missing or invalid credentials")
TopicAuthorizationFailedError = _error(
    "TopicAuthorizationFailedError", "TOPIC_AUTHORIZATION_FAILED", 403, abortable=True, doc="not allowed on this topic"
)
GroupAuthorizationFailedError = _error(
    "GroupAuthorizationFailedError", "GROUP_AUTHORIZATION_FAILED", 403, abortable=True, doc="not allowed on this group"
)
ClusterAuthorizationFailedError = _error(
    "ClusterAuthorizationFailedError",
    "CLUSTER_AUTHORIZATION_FAILED",
    403,
    doc="not allowed on the cluster (topic creation, admin operations)",
)
TransactionalIdAuthorizationFailedError = _error(
    "TransactionalIdAuthorizationFailedError",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    403,
    fatal=True,
    doc="not allowed on this transactional id",
)
CoordinatorLoadInProgressError = _error(
    "CoordinatorLoadInProgressError", "COORDINATOR_LOAD_IN_PROGRESS", 503, retriable=True, doc="the server is starting"
)
CoordinatorNotAvailableError = _error(
    "CoordinatorNotAvailableError",
    "COORDINATOR_NOT_AVAILABLE",
    503,
    retriable=True,
    doc="the server's database is unavailable",
)
UnknownServerError = _error(
    "UnknownServerError",
    "UNKNOWN_SERVER_ERROR",
    500,
    retriable=True,
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
        TransactionalIdNotFoundError,
        GroupIdNotFoundError,
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
        UnstableOffsetCommitError,
        OffsetOutOfRangeError,
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


class TxbrokerTimeoutError(TxbrokerError):
    """A client-side deadline (max_block_ms, delivery_timeout_ms, a future's timeout) passed. For a
    commit, the transaction's outcome is not known yet: call commit_transaction() again to resume."""

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
