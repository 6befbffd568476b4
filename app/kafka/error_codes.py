"""txbroker's error codes (app/errors.py) as Kafka's numeric ones. The names are Kafka's, so the
mapping is by name; the few codes of the HTTP contract that Kafka has no name for map to their
closest Kafka meaning."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, ErrorCode, InvalidTimestamps

_BY_NAME: dict[ErrorCode, KafkaError] = {
    code: KafkaError[code.name.lower()] for code in ErrorCode if code.name.lower() in KafkaError.__members__
}
_CLOSEST: dict[ErrorCode, KafkaError] = {
    ErrorCode.RECORD_TOO_LARGE: KafkaError.message_too_large,
    ErrorCode.UNAUTHORIZED: KafkaError.sasl_authentication_failed,
    ErrorCode.NOT_FOUND: KafkaError.invalid_request,
    ErrorCode.METHOD_NOT_ALLOWED: KafkaError.invalid_request,
}


def kafka_error(error: BrokerError | None) -> KafkaError:
    if error is None:
        return KafkaError.none
    if isinstance(error, InvalidTimestamps):  # INVALID_RECORD in the HTTP contract, which has no timestamp code
        return KafkaError.invalid_timestamp
    return _BY_NAME.get(error.code) or _CLOSEST.get(error.code, KafkaError.unknown_server_error)


def error_message(error: BrokerError | None) -> str | None:
    """The error_message field of a response's entry (None without an error)."""
    return None if error is None else error.message


def versioned_error(error: BrokerError | None, api_version: int, producer_fenced_since: int | None) -> KafkaError:
    """kafka_error, for an API that learned PRODUCER_FENCED (KIP-588) at `producer_fenced_since`
    (None: never, as Produce): older versions get INVALID_PRODUCER_EPOCH for it, as Kafka answers."""
    code = kafka_error(error)
    if code == KafkaError.producer_fenced and (producer_fenced_since is None or api_version < producer_fenced_since):
        return KafkaError.invalid_producer_epoch
    return code
