"""Produce's commands and checks: the request-level checks that need no database, and those of an
idempotent producer against what the server issued to it. The writing is app/coordinator/batched_writes.py's
(each partition's batch appended, in one PostgreSQL transaction that concurrent requests share).

Request-level errors fail the whole request and append nothing (docs/api.md, "Producing"); partition-level
errors fail only their partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from app.coordinator.transaction_coordinator import unknown_producer
from app.errors import BrokerError, ErrorCode, invalid_request
from app.storage.log.append import AppendResult
from app.storage.log.record_codec import (
    BASE64,
    ENCODINGS,
    UTF8,
    EncodedBatch,
    WireRecord,
    decode_base64,
    encode_json_records,
)
from app.storage.log.topics import INTERNAL_PREFIX
from app.storage.transactions.producer_ids import IssuedProducer
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE

# What a front door needs to build a ProduceCommand: the sentinels of a plain write, and the
# record encodings (a door may validate and encode the records itself, `PartitionRecords.encoded`:
# JSON records, or a Kafka RecordBatch stored as it is, EncodedBatch.record_batch).
__all__ = [
    "BASE64",
    "ENCODINGS",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "UTF8",
    "AppendResult",
    "EncodedBatch",
    "PartitionRecords",
    "PartitionResult",
    "ProduceCommand",
    "WireRecord",
    "check_idempotent_producer",
    "check_request",
    "decode_base64",
    "encode_json_records",
]

PartitionResult = AppendResult | BrokerError


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One partition's records; `encoded` when the caller has already validated and encoded them
    (the API's fast path, the Kafka door's batches, whose `records` are then not needed), else they
    are encoded here. `topic_uuid`: the topic's Kafka id when the request named the topic by it
    (Produce v13+, whose door resolved it to `topic` earlier): the write batch appends only to the
    topic of that id, so a topic deleted and re-created under the name since is UNKNOWN_TOPIC_ID."""

    topic: str
    partition: int
    base_sequence: int
    records: Sequence[WireRecord]
    encoded: EncodedBatch | None = None
    topic_uuid: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class ProduceCommand:
    transactional_id: str | None
    producer_id: int
    producer_epoch: int
    encoding: str
    partitions: Sequence[PartitionRecords]
    # Kafka's leaders keep no list of the ids issued, and take a producer they hold no state for at
    # any sequence; Kafka's clients rely on it once their idempotent producer id expired (librdkafka
    # bumps its epoch itself and starts again at sequence 0, aiokafka goes on with its sequence).
    # The Kafka door asks for that rule: an expired id is taken up again, owned by `principal`. HTTP's
    # contract answers UNKNOWN_PRODUCER_ID instead, and its clients take a new id.
    takes_expired_producers: bool = False
    principal: str | None = None

    @property
    def is_plain(self) -> bool:
        return self.producer_id == NO_PRODUCER_ID and self.transactional_id is None


def check_request(command: ProduceCommand, max_records: int) -> None:
    if command.transactional_id is not None and command.producer_id == NO_PRODUCER_ID:
        raise invalid_request(
            f"transactional_id {command.transactional_id!r} was sent with producer_id -1: a transactional "
            f"write needs the producer id and epoch from POST /v1/producers/init"
        )
    seen = set()
    total = 0
    for index, entry in enumerate(command.partitions):
        if (entry.topic, entry.partition) in seen:
            raise invalid_request(
                f"partitions[{index}]: {entry.topic}-{entry.partition} is listed twice: "
                f"send each partition once, with all its records"
            )
        seen.add((entry.topic, entry.partition))
        if command.producer_id != NO_PRODUCER_ID and entry.base_sequence == NO_SEQUENCE:
            raise invalid_request(
                f"partitions[{index}]: base_sequence is -1 with producer_id "
                f"{command.producer_id}: an idempotent write numbers its records from 0"
            )
        if entry.topic.startswith(INTERNAL_PREFIX):
            raise BrokerError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"partitions[{index}]: topic {entry.topic!r} is internal to txbroker and cannot be written by clients",
            )
        total += len(entry.records) if entry.encoded is None else entry.encoded.record_count
    if total > max_records:
        raise invalid_request(
            f"the request carries {total} records: expected at most {max_records} per request; split it"
        )


def check_idempotent_producer(issued: IssuedProducer | None, command: ProduceCommand) -> BrokerError | None:
    """Request-level errors raise; an epoch the producer itself has since bumped (KIP-360) is
    returned, to answer every partition with it: the partitions may not have seen the new epoch
    yet, but the server knows it, so the old epoch is fenced everywhere at once. An epoch above the
    one issued is the producer's own bump, which each partition checks (a new epoch starts at
    sequence 0, and fences the lower ones there): an idempotent producer id has one holder, and
    Kafka's partition leaders accept it, which librdkafka relies on (it bumps its epoch itself, with
    no request, once a batch failed and its sequence has a gap)."""
    if issued is None:
        raise unknown_producer(command.producer_id)
    if issued.transactional_id is not None:
        raise BrokerError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {command.producer_id} belongs to transactional id {issued.transactional_id!r}: "
            f"send that transactional_id with its writes",
        )
    if command.producer_epoch < issued.producer_epoch:
        return BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"producer {command.producer_id} wrote with epoch {command.producer_epoch}, but epoch "
            f"{issued.producer_epoch} was issued to it since: this producer instance is stale; close it",
        )
    return None
