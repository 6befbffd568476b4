"""What the node's metrics count of the Kafka door's requests, as a Kafka broker's RequestMetrics
do (RequestsPerSec, ErrorsPerSec, TotalTimeMs by `request`): each request of an API this listener
serves, by Kafka's name for the API; the time to its answer; and the error codes its answer carries,
by Kafka's name for the code, one per occurrence (a Produce answered UNKNOWN_TOPIC_OR_PARTITION for
two partitions counts two), as Kafka's `errorCounts` count them. NONE is left out (the requests
count the answers), so the error series are only those codes that occurred. A request answered by
closing its connection instead (PostgreSQL away for an API with no retriable code, a failed acks=0
Produce, a request that does not parse) counts CONNECTION_CLOSED, which is not a Kafka code.

Every label value comes from a fixed set (api_table's APIs, kio's error codes): nothing a client
sends (a topic, a client id) becomes a series."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable

from app.kafka import api_table

# Kafka's names of the APIs (its ApiKeys' names: Produce, InitProducerId, ApiVersions, ...), which
# api_table's constants spell in upper snake case.
API_NAMES: dict[int, str] = {
    key: name.title().replace("_", "")
    for name, key in vars(api_table).items()
    if name.isupper() and isinstance(key, int) and key in api_table.SUPPORTED_VERSIONS
}
CONNECTION_CLOSED = "CONNECTION_CLOSED"
_ERROR_CODE_TYPE = "error_code"  # kio's kafka_type of an error code field

# (api name, seconds to the answer, the error names it carried): what the node's metrics take.
CountRequest = Callable[[str, float, Iterable[str]], None]


class CountedRequest:
    """One request, timed from its arrival; counted once, when it is answered or its connection
    closed for it (a request whose connection went away while it waited counts without an error)."""

    __slots__ = ("_api", "_count", "_started")

    def __init__(self, count: CountRequest, api_key: int) -> None:
        self._count = count
        self._api = API_NAMES[api_key]
        self._started = time.perf_counter()

    def answered(self, response: object | None) -> None:
        """`response`: the kio message answered (None: none, an acks=0 Produce)."""
        self._count(self._api, time.perf_counter() - self._started, error_names(response))

    def failed(self, error: BaseException | None) -> None:
        """Not answered: its connection is closed for it (`error`, None when refused without one),
        CONNECTION_CLOSED; or it was cancelled because its connection went away, no error."""
        errors = () if isinstance(error, asyncio.CancelledError) else (CONNECTION_CLOSED,)
        self._count(self._api, time.perf_counter() - self._started, errors)


def error_names(message: object | None) -> list[str]:
    """Kafka's names of the error codes in a response (none for NONE), one per occurrence."""
    found: list[str] = []
    if message is not None:
        _collect_errors(message, found)
    return found


def _collect_errors(message: object, found: list[str]) -> None:
    codes, nested = _error_fields(type(message))
    for name in codes:
        code = getattr(message, name)
        if code:  # NONE is 0
            found.append(code.name.upper())
    for name in nested:
        value = getattr(message, name)
        if isinstance(value, tuple):
            for item in value:
                _collect_errors(item, found)
        elif value is not None:
            _collect_errors(value, found)


@functools.cache
def _error_fields(message_class: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the error code fields, the fields holding nested messages) of a kio message class: a
    nested message or an array of them is the one kind of field kio gives no kafka_type."""
    codes, nested = [], []
    for field in dataclasses.fields(message_class):
        kafka_type = field.metadata.get("kafka_type")
        if kafka_type == _ERROR_CODE_TYPE:
            codes.append(field.name)
        elif kafka_type is None:
            nested.append(field.name)
    return tuple(codes), tuple(nested)
