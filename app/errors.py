"""The closed registry of txbroker's error codes, and the one exception that carries them.

Every error that reaches a client is a `BrokerError` with a code from `ErrorCode`. The code names are
part of the HTTP contract (API.md, "Error codes"): like Kafka's `Errors.java`, a code's HTTP status and
retriability are declared once here and never change meaning.

    Exception
     └── BrokerError          an expected outcome the client must act on (fenced, unknown topic, ...)

Expected outcomes are `BrokerError`s raised by the coordinator and storage layers (or returned as
per-partition values); anything else escaping a request is a bug, rendered as UNKNOWN_SERVER_ERROR by
the API layer's single exception handler.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType


class ErrorCode(StrEnum):
    INVALID_REQUEST = "INVALID_REQUEST"
    INVALID_TOPIC_EXCEPTION = "INVALID_TOPIC_EXCEPTION"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_RECORD = "INVALID_RECORD"
    INVALID_TRANSACTION_TIMEOUT = "INVALID_TRANSACTION_TIMEOUT"
    RECORD_TOO_LARGE = "RECORD_TOO_LARGE"
    INVALID_CONFIG = "INVALID_CONFIG"
    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    TRANSACTIONAL_ID_NOT_FOUND = "TRANSACTIONAL_ID_NOT_FOUND"
    GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
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
    UNSTABLE_OFFSET_COMMIT = "UNSTABLE_OFFSET_COMMIT"
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
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
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND: ErrorSpec(404, False, "admin look-up of an unknown id"),
        ErrorCode.GROUP_ID_NOT_FOUND: ErrorSpec(404, False, "describe of an unknown group"),
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
        ErrorCode.UNSTABLE_OFFSET_COMMIT: ErrorSpec(409, True, "a transactional offset is pending"),
        ErrorCode.OFFSET_OUT_OF_RANGE: ErrorSpec(416, False, "offset outside the log"),
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


class BrokerError(Exception):
    """An outcome a client must act on, with a code of the contract and a message that says what was
    received, what was expected and what to do."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def spec(self) -> ErrorSpec:
        return ERROR_SPECS[self.code]

    @property
    def http_status(self) -> int:
        return self.spec.http_status

    @property
    def retriable(self) -> bool:
        return self.spec.retriable

    def as_dict(self) -> dict:
        """The contract's error object, as carried in error bodies and per-partition results."""
        return {"code": str(self.code), "message": self.message, "retriable": self.retriable}


def invalid_request(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, message)
