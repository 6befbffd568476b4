"""Produce: request-level checks (including the producer against the coordinator), then each
partition's batch appended, all in one PostgreSQL transaction, which concurrent requests share
(group commit, `ProduceGroups`).

Request-level errors fail the whole request and append nothing (API.md "Producing"); partition-level
errors fail only their partition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator.group_commit import GroupCommit
from app.coordinator.transaction_coordinator import TransactionCoordinator, unknown_producer
from app.errors import BrokerError, ErrorCode, invalid_request
from app.storage import partition_log, producer_ids, record_codec
from app.storage.partition_log import NO_PRODUCER_ID, NO_SEQUENCE, AppendResult, BatchAppend
from app.storage.producer_ids import IssuedProducer
from app.storage.record_codec import EncodedBatch, WireRecord
from app.storage.topics import INTERNAL_PREFIX, find_topics, unknown_topic

PartitionResult = AppendResult | BrokerError


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

    @property
    def is_plain(self) -> bool:
        return self.producer_id == NO_PRODUCER_ID and self.transactional_id is None


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


def _check_idempotent_producer(issued: IssuedProducer | None, command: ProduceCommand) -> BrokerError | None:
    """Request-level errors raise; an epoch the producer itself has since bumped (KIP-360) is
    returned, to answer every partition with it: the partitions may not have seen the new epoch
    yet, but the server knows it, so the old epoch is fenced everywhere at once."""
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


@dataclass(frozen=True, slots=True)
class _Request:
    """A produce request checked and encoded, for a group to write."""

    command: ProduceCommand
    encoded: list[EncodedBatch]


def _transaction_if_needed(conn: asyncpg.Connection, group: list[_Request]):
    """A lone plain write to one partition is one statement after a read (the topic lookup):
    PostgreSQL runs that statement as a transaction of its own, so BEGIN and COMMIT would be two
    round trips for nothing. It is safe because the statement itself re-checks what the read found
    (it bumps the partition's row, which a deleted topic no longer has) and NOTIFY is still sent at
    its commit. Producers' writes (sequence state, the coordinator's row), writes to several
    partitions (all visible at once, or none) and groups keep their PostgreSQL transaction."""
    if len(group) == 1 and group[0].command.is_plain and len(group[0].command.partitions) == 1:
        return contextlib.nullcontext()
    return conn.transaction()


class ProduceGroups:
    """Produce with group commit (app/coordinator/group_commit.py): the requests of a group share
    each statement (their producers and transactional ids looked up and locked together, their
    partitions locked together in lock_order, their batches written by one statement) and one
    commit."""

    def __init__(self, coordinator: TransactionCoordinator, max_records: int) -> None:
        self.coordinator = coordinator
        self.max_records = max_records
        self.groups: GroupCommit[_Request, list[PartitionResult]] = GroupCommit(self._write)

    async def produce(self, command: ProduceCommand) -> list[PartitionResult]:
        _check_request(command, self.max_records)
        appended_ms = now_ms()
        encoded = [
            entry.encoded
            or record_codec.encode_batch(entry.records, command.encoding, appended_ms, f"partitions[{index}].records")
            for index, entry in enumerate(command.partitions)
        ]
        return await self.groups.submit(_Request(command, encoded))

    async def _write(self, group: list[_Request]) -> list[list[PartitionResult] | BrokerError]:
        """Writes the group in one PostgreSQL transaction: each request's per-partition results, or
        its request-level error (it then appends nothing)."""
        coordinator = self.coordinator
        transactional_ids = {r.command.transactional_id for r in group if r.command.transactional_id is not None}
        idempotent = {
            r.command.producer_id for r in group if not r.command.is_plain and r.command.transactional_id is None
        }
        async with coordinator.pool.acquire() as conn, _transaction_if_needed(conn, group):
            topic_names = sorted({e.topic for r in group for e in r.command.partitions})
            # The coordinator's rows first (in id order), then the partitions (append_batches, in
            # lock_order), then the transaction log (save_statement): TransactionLog's lock order.
            if transactional_ids:
                metas, topics = await coordinator.log.lock_many_and_find_topics(
                    conn, list(transactional_ids), topic_names
                )
            else:
                metas, topics = {}, await find_topics(conn, topic_names)
            issued = await producer_ids.lookup_many(conn, list(idempotent)) if idempotent else {}
            answers: list[list[PartitionResult | None] | BrokerError] = []
            appends: list[BatchAppend] = []
            owners: list[tuple[int, int]] = []  # (request, partition) of each append
            joined = {}
            for request_index, request in enumerate(group):
                command = request.command
                try:
                    if command.transactional_id is not None:
                        joined[command.transactional_id] = coordinator.join_for_produce(
                            metas.get(command.transactional_id),
                            command.transactional_id,
                            command.producer_id,
                            command.producer_epoch,
                            [(entry.topic, entry.partition) for entry in command.partitions],
                            topics,
                        )
                    elif not command.is_plain:
                        stale = _check_idempotent_producer(issued.get(command.producer_id), command)
                        if stale is not None:
                            answers.append([stale] * len(command.partitions))
                            continue
                except BrokerError as error:
                    answers.append(error)
                    continue
                results: list[PartitionResult | None] = []
                for partition_index, (entry, batch) in enumerate(zip(command.partitions, request.encoded)):
                    topic = topics.get(entry.topic)
                    if topic is None:
                        results.append(unknown_topic(entry.topic))
                        continue
                    results.append(None)
                    owners.append((request_index, partition_index))
                    appends.append(
                        BatchAppend(
                            topic,
                            entry.partition,
                            batch,
                            command.producer_id,
                            command.producer_epoch,
                            entry.base_sequence,
                            command.transactional_id is not None,
                        )
                    )
                answers.append(results)
            # The transaction log's write goes with the batches' (one round trip), last: see
            # TransactionLog's lock order.
            save = await coordinator.log.save_statement(conn, list(joined.values()))
            for (request_index, partition_index), result in zip(
                owners, await partition_log.append_batches(conn, appends, then=save)
            ):
                answers[request_index][partition_index] = result
        return answers
