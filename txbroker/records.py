"""The values the SDK hands out and takes in, and the record encoding of the wire.

Records travel base64-encoded (the contract's `"encoding": "base64"`), so arbitrary bytes round-trip;
keys, values and header values are `bytes` in the SDK (a `str` is accepted and UTF-8 encoded).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import NamedTuple, Union

from txbroker.errors import from_body
from txbroker.wire import NO_GENERATION, NO_MEMBER

BASE64 = "base64"

Bytes = Union[bytes, bytearray, memoryview, str]
Headers = Union[list[tuple[str, Union[Bytes, None]]], dict[str, Union[Bytes, None]], None]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a produced record was written."""

    topic: str
    partition: int
    offset: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str | None = None


class ConsumerGroupMetadata(NamedTuple):
    """What `send_offsets_to_transaction` needs to fence a zombie consumer (KIP-447): the group, and
    the generation and member id of the assignment the consumed records came from."""

    group_id: str
    generation_id: int = NO_GENERATION
    member_id: str = NO_MEMBER


class PreparedTransaction(NamedTuple):
    """What a coordinator needs to finish a Prepared transaction (KIP-939, txbroker.two_phase): the
    EndTxn identity that `Producer.prepare_transaction()` returns."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is slower, per record (bench.sdk)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def to_bytes(value: Bytes | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str (UTF-8 encoded), not {type(value).__name__}: serialize it first")


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def header_list(headers: Headers) -> list[tuple[str, bytes | None]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(_header_key(key), to_bytes(value, f"header {key!r}")) for key, value in items]


def _header_key(key: object) -> str:
    # str() would write None as the key "None" and b"k" as "b'k'": records no one sent.
    if key is None:
        raise TypeError(
            "a header's key must be a str, not None: Kafka's headers have no null key (a value may be None)"
        )
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).decode("utf-8")
    return str(key)


def wire_record(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], timestamp_ms: int | None
) -> dict:
    """One record of a produce request, base64-encoded."""
    record: dict = {"key": b64(key), "value": b64(value)}
    if headers:
        record["headers"] = [{"key": k, "value": b64(v)} for k, v in headers]
    if timestamp_ms is not None:
        record["timestamp_ms"] = timestamp_ms
    return record


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> int:
    """What a record counts against batch_size (the contract's max_message_bytes measure)."""
    return (
        (len(key) if key else 0) + (len(value) if value else 0) + sum(len(k) + (len(v) if v else 0) for k, v in headers)
    )


def consumer_record(topic: str, partition: int, wire: dict, _decode=base64.b64decode) -> ConsumerRecord:
    """A fetched record; fetches ask for base64, so every field is base64 (or null)."""
    key, value, headers = wire["key"], wire["value"], wire["headers"]
    return ConsumerRecord(
        topic,
        partition,
        wire["offset"],
        None if key is None else _decode(key),
        None if value is None else _decode(value),
        [(h["key"], None if h["value"] is None else _decode(h["value"])) for h in headers] if headers else [],
        wire["timestamp_ms"],
    )


def listed_offsets(answer: dict) -> dict[TopicPartition, int]:
    """The offset of each partition of a ListOffsets answer; raises the first partition's error.
    Called within the retried attempt (`answered=`), a retriable one (OFFSET_NOT_AVAILABLE: the
    database's synchronous standby has not confirmed the offset) is retried as a retriable answer
    to the whole request would be, until the call's timeout."""
    found = {}
    for entry in answer["partitions"]:
        if entry["error"] is not None:
            raise from_body(entry["error"])
        found[TopicPartition(entry["topic"], entry["partition"])] = entry["offset"]
    return found


# Readers of answers (Connection.request's `read=`): what the caller reads of an answer, read within
# the retried attempt, so that an answer lacking a field is retried as a lost one is.


def producer_ids(answer: dict) -> tuple[int, int]:
    """The producer id and epoch of an InitProducerId, PrepareTxn or EndTxn answer."""
    return answer["producer_id"], answer["producer_epoch"]


def offset_errors(answer: dict) -> list[dict | None]:
    """The error (None for none) of each partition of an OffsetCommit or TxnOffsetCommit answer."""
    return [entry["error"] for entry in answer["offsets"]]
