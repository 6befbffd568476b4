"""The closed registry of txbroker's error codes, and the one exception that carries them.

Every error that reaches a client is a `BrokerError` with a code from `ErrorCode`. The code names are
part of the HTTP contract (docs/api.md, "Error codes"): like Kafka's `Errors.java`, a code's HTTP status and
retriability are declared once (txbroker/wire.py) and never change meaning.

    Exception
     └── BrokerError          an expected outcome the client must act on (fenced, unknown topic, ...)
          └── InvalidRecords  INVALID_RECORD naming the records of the batch at fault (Kafka's record_errors)
               └── InvalidTimestamps  ... for their timestamps, out of the topic's bounds (Kafka's INVALID_TIMESTAMP)
     └── DatabaseUnavailable  COORDINATOR_NOT_AVAILABLE because PostgreSQL is away (each Kafka API's own code)

Expected outcomes are `BrokerError`s raised by the coordinator and storage layers (or returned as
per-partition values); anything else escaping a request is a bug, rendered as UNKNOWN_SERVER_ERROR by
the API layer's single exception handler.
"""

from __future__ import annotations

# The codes and their table are facts of the wire that the SDK maps back to its classes: declared
# once, in txbroker/wire.py, and the server's under these names.
from txbroker.wire import ERROR_SPECS, ErrorCode, ErrorSpec

__all__ = [
    "ERROR_SPECS",
    "BrokerError",
    "DatabaseUnavailable",
    "ErrorCode",
    "ErrorSpec",
    "InvalidRecords",
    "InvalidTimestamps",
    "invalid_request",
]


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


class InvalidRecords(BrokerError):
    """INVALID_RECORD for a batch refused because of some of its records: their indexes in the batch
    (Kafka's ProduceResponse lists them in record_errors; its clients fail the others of the batch
    with an error of their own)."""

    def __init__(self, record_indexes: tuple[int, ...], message: str) -> None:
        super().__init__(ErrorCode.INVALID_RECORD, message)
        self.record_indexes = record_indexes


class InvalidTimestamps(InvalidRecords):
    """A batch refused because some of its records are timestamped outside the window its topic
    allows around the broker's clock (message.timestamp.before.max.ms and after.max.ms, as Kafka's
    LogValidator), or, `marked_log_append_time`, because its producer marked it LogAppendTime, a
    timestamp type only a broker sets (Kafka's LogValidator refuses it alike). The HTTP contract's
    code is INVALID_RECORD (it has none for timestamps); the Kafka door answers Kafka's
    INVALID_TIMESTAMP, with each record's reason in Kafka's words, from `timestamps` (each refused
    record's index in the batch and timestamp) and the window [`earliest_ms`, `latest_ms`]."""

    def __init__(
        self,
        timestamps: tuple[tuple[int, int], ...],
        earliest_ms: int,
        latest_ms: int,
        message: str,
        marked_log_append_time: bool = False,
    ) -> None:
        super().__init__(tuple(index for index, _ in timestamps), message)
        self.timestamps = timestamps
        self.earliest_ms = earliest_ms
        self.latest_ms = latest_ms
        self.marked_log_append_time = marked_log_append_time


class DatabaseUnavailable(BrokerError):
    """COORDINATOR_NOT_AVAILABLE (retriable) for a request that met PostgreSQL away: unreachable,
    restarting, read-only, or a commit its synchronous standby did not confirm
    (app.coordinator.health.unavailable). Nothing is acknowledged, and its retry finds what it may
    have written. The HTTP contract has this one code for it; the Kafka door answers each API's
    retriable code for a storage its broker cannot reach (app/kafka/error_codes.py)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)


def invalid_request(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, message)
