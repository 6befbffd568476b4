"""Produce: request-level checks (including the producer against the coordinator), then each
partition's batch appended, all in one PostgreSQL transaction.

Request-level errors fail the whole request and append nothing (API.md "Producing"); partition-level
errors fail only their partition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator.transaction_coordinator import TransactionCoordinator, unknown_producer
from app.errors import BrokerError, ErrorCode, invalid_request
from app.storage import partition_log, producer_ids, record_codec
from app.storage.partition_log import NO_PRODUCER_ID, NO_SEQUENCE, AppendResult, BatchAppend
from app.storage.record_codec import EncodedBatch, WireRecord
from app.storage.topics import INTERNAL_PREFIX, find_topics, unknown_topic


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One partition's records; `encoded` when the caller has already validated and encoded them
    (the API's fast path), else they are encoded here."""

    topic: str
    partition: int
    base_sequence: int
    records: Sequence[WireRecord]
    encoded: EncodedBatch | None = None


@dataclass(frozen=True, slots=True)
class ProduceCommand:
    transactional_id: str | None
    producer_id: int
    producer_epoch: int
    encoding: str
    partitions: Sequence[PartitionRecords]


def _check_request(command: ProduceCommand, max_records: int) -> None:
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
        total += len(entry.records)
    if total > max_records:
        raise invalid_request(
            f"the request carries {total} records: expected at most {max_records} per request; split it"
        )


async def _check_idempotent_producer(conn: asyncpg.Connection, command: ProduceCommand) -> BrokerError | None:
    """Request-level errors raise; an epoch the producer itself has since bumped (KIP-360) is
    returned, to answer every partition with it: the partitions may not have seen the new epoch
    yet, but the server knows it, so the old epoch is fenced everywhere at once."""
    issued = await producer_ids.lookup(conn, command.producer_id)
    if issued is None:
        raise unknown_producer(command.producer_id)
    if issued.transactional_id is not None:
        raise BrokerError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {command.producer_id} belongs to transactional id {issued.transactional_id!r}: "
            f"send that transactional_id with its writes",
        )
    if command.producer_epoch > issued.producer_epoch:
        raise BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"epoch {command.producer_epoch} of producer {command.producer_id} was never issued "
            f"(the latest is {issued.producer_epoch})",
        )
    if command.producer_epoch < issued.producer_epoch:
        return BrokerError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"producer {command.producer_id} wrote with epoch {command.producer_epoch}, but epoch "
            f"{issued.producer_epoch} was issued to it since: this producer instance is stale; close it",
        )
    return None


def _transaction_if_needed(conn: asyncpg.Connection, command: ProduceCommand):
    """A plain write to one partition is one statement after a read (the topic lookup): PostgreSQL
    runs that statement as a transaction of its own, so BEGIN and COMMIT would be two round trips
    for nothing. It is safe because the statement itself re-checks what the read found (it bumps
    the partition's row, which a deleted topic no longer has) and NOTIFY is still sent at its commit.
    Producers' writes (sequence state, the coordinator's row) and writes to several partitions
    (all visible at once, or none) keep their PostgreSQL transaction."""
    if command.producer_id == NO_PRODUCER_ID and command.transactional_id is None and len(command.partitions) == 1:
        return contextlib.nullcontext()
    return conn.transaction()


async def produce(
    coordinator: TransactionCoordinator, command: ProduceCommand, max_records: int
) -> list[AppendResult | BrokerError]:
    _check_request(command, max_records)
    appended_ms = now_ms()
    encoded = [
        entry.encoded
        or record_codec.encode_batch(entry.records, command.encoding, appended_ms, f"partitions[{index}].records")
        for index, entry in enumerate(command.partitions)
    ]
    transactional = command.transactional_id is not None
    async with coordinator.pool.acquire() as conn, _transaction_if_needed(conn, command):
        topics = await find_topics(conn, sorted({entry.topic for entry in command.partitions}))
        meta = None
        if transactional:
            meta = await coordinator.join_for_produce(
                conn,
                command.transactional_id,
                command.producer_id,
                command.producer_epoch,
                [(entry.topic, entry.partition) for entry in command.partitions],
                topics,
            )
        elif command.producer_id != NO_PRODUCER_ID:
            stale = await _check_idempotent_producer(conn, command)
            if stale is not None:
                return [stale] * len(command.partitions)
        results: list[AppendResult | BrokerError | None] = []
        appends: list[BatchAppend] = []
        for entry, batch in zip(command.partitions, encoded):
            topic = topics.get(entry.topic)
            if topic is None:
                results.append(unknown_topic(entry.topic))
                continue
            results.append(None)
            appends.append(
                BatchAppend(
                    topic,
                    entry.partition,
                    batch,
                    command.producer_id,
                    command.producer_epoch,
                    entry.base_sequence,
                    transactional,
                )
            )
        appended = iter(await partition_log.append_batches(conn, appends))
        if meta is not None:
            await coordinator.log.save(conn, meta)  # last: see TransactionLog's lock order
    return [next(appended) if result is None else result for result in results]
