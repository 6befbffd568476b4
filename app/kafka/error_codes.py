"""txbroker's error codes (app/errors.py) as Kafka's numeric ones. The names are Kafka's, so the
mapping is by name; the few codes of the HTTP contract that Kafka has no name for map to their
closest Kafka meaning."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, DatabaseUnavailable, ErrorCode, InvalidTimestamps
from app.kafka.frames import CloseConnection

_BY_NAME: dict[ErrorCode, KafkaError] = {
    code: KafkaError[code.name.lower()] for code in ErrorCode if code.name.lower() in KafkaError.__members__
}
_CLOSEST: dict[ErrorCode, KafkaError] = {
    ErrorCode.RECORD_TOO_LARGE: KafkaError.message_too_large,
    ErrorCode.UNAUTHORIZED: KafkaError.sasl_authentication_failed,
    ErrorCode.NOT_FOUND: KafkaError.invalid_request,
    ErrorCode.METHOD_NOT_ALLOWED: KafkaError.invalid_request,
}


# What a request that met PostgreSQL away (DatabaseUnavailable) is answered, by API, as Kafka's broker
# answers when it cannot reach a partition's storage; every code retriable for every Kafka client.
# The coordinators' APIs (transactions, groups, offsets): COORDINATOR_NOT_AVAILABLE, as Kafka's
# coordinators answer a request whose write to their log failed (the default below). Produce:
# NOT_ENOUGH_REPLICAS_AFTER_APPEND, "written, maybe not durably": the write batch may have committed
# before its connection to PostgreSQL broke, and a client treats the batch as possibly persisted, which
# an idempotent producer's retry settles (answered as its duplicate, with its offsets). Fetch and
# ListOffsets: KAFKA_STORAGE_ERROR, a log Kafka's broker cannot read. Metadata: LEADER_NOT_AVAILABLE
# for each topic asked, its partitions unknown until PostgreSQL answers.
PRODUCE_WHILE_DATABASE_UNAVAILABLE = KafkaError.not_enough_replicas_after_append
READ_WHILE_DATABASE_UNAVAILABLE = KafkaError.kafka_storage_error
METADATA_WHILE_DATABASE_UNAVAILABLE = KafkaError.leader_not_available


def kafka_error(
    error: BrokerError | None, database_unavailable: KafkaError = KafkaError.coordinator_not_available
) -> KafkaError:
    """`database_unavailable`: the API's answer for DatabaseUnavailable (the constants above)."""
    if error is None:
        return KafkaError.none
    if isinstance(error, DatabaseUnavailable):
        return database_unavailable
    if isinstance(error, InvalidTimestamps):  # INVALID_RECORD in the HTTP contract, which has no timestamp code
        return KafkaError.invalid_timestamp
    return _BY_NAME.get(error.code) or _CLOSEST.get(error.code, KafkaError.unknown_server_error)


def error_message(error: BrokerError | None) -> str | None:
    """The error_message field of a response's entry (None without an error)."""
    return None if error is None else error.message


def versioned_error(
    error: BrokerError | None,
    api_version: int,
    producer_fenced_since: int | None,
    database_unavailable: KafkaError = KafkaError.coordinator_not_available,
) -> KafkaError:
    """kafka_error, for an API that learned PRODUCER_FENCED (KIP-588) at `producer_fenced_since`
    (None: never, as Produce): older versions get INVALID_PRODUCER_EPOCH for it, as Kafka answers."""
    code = kafka_error(error, database_unavailable)
    if code == KafkaError.producer_fenced and (producer_fenced_since is None or api_version < producer_fenced_since):
        return KafkaError.invalid_producer_epoch
    return code


@contextlib.contextmanager
def closed_when_unconfirmed(api: str) -> Iterator[None]:
    """For a read whose answer has no error code its clients retry (Metadata of every topic,
    DescribeConfigs, DescribeAcls, DescribeUserScramCredentials: Kafka's admin client hands each
    code to its caller, and an empty answer would be taken for "none"): a read the synchronous
    standby has not confirmed (DatabaseUnavailable, docs/operations-high-availability.md) closes the
    connection, as the same request does while PostgreSQL is away, and Kafka's clients ask again on
    a new one."""
    try:
        yield
    except DatabaseUnavailable as unconfirmed:
        raise CloseConnection(f"{api} not answered: {unconfirmed.message}") from unconfirmed
