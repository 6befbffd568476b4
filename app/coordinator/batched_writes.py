"""Produce, EndTxn, AddPartitionsToTxn and AddOffsetsToTxn in write batches
(app/coordinator/write_batching.py): the requests of these kinds that queue in one server process
while a write batch is written are written together, in one PostgreSQL transaction, as if one after
the other in their order of arrival. A small transaction is a produce and an EndTxn over HTTP, and
an AddPartitionsToTxn, a produce per partition and an EndTxn from Kafka's clients: batching every
kind together lets the requests of all producers share every statement and the commit, where a
write batch (or a unit of work) of each kind took one PostgreSQL transaction each.
("Write batch" is the requests written together; a "record batch" is Kafka's, what a produce
appends to a partition.)

A write batch's statements, in the unit of work's lock order: the transactional ids' rows locked
(in id order) and the topics read; the idempotent producers looked up, if any; every partition
locked (in lock_order) with the states and markers the write batch needs there; the record
batches, the markers and the transaction log written by one statement
(UnitOfWork.write_partitions_and_save); the commit. Every state change is made on the locked rows
in the requests' order of arrival (an EndTxn after a produce of its transaction in the same write
batch commits it; a produce after its transaction's EndTxn is fenced; partitions added join the
transaction open when their request's turn comes). Adding partitions writes no partition: only the
transaction log's record and the id's row, with the others' save, and it is answered after the
commit, as Kafka answers an AddPartitionsToTxn once its record is durable. The record batches go
before the markers in their partitions: the requests that arrived
together were concurrent, so any order is one they could have had, as long as each producer's and
each transaction's own are kept, and they are.

A record batch is stored in its topic's form (batch_form.py: recompressed into compression.type,
stamped at LogAppendTime), which can take seconds, minutes at zstd's highest levels, for large
batches. Done inside the PostgreSQL transaction, after the transactional ids' rows are locked, that
work made the transaction wait longer than the request pool's idle_in_transaction_session_timeout
(`database_idle_in_transaction_timeout_ms`) for its next statement, and PostgreSQL ended it: a large
produce to such a topic was never written. A write batch whose record batches carry
CONVERTED_AHEAD_BYTES or more therefore reads their topics and converts them before its transaction,
off the event loop (the codecs release the GIL); in the transaction, a batch whose topic's form is
still the one it was converted for is taken as it is, and one whose topic changed its form meanwhile
(a config change between the two reads) is converted there again, as before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator.produce import (
    PartitionRecords,
    PartitionResult,
    ProduceCommand,
    check_idempotent_producer,
    check_request,
)
from app.coordinator.transaction_coordinator import (
    AddOffsetsCommand,
    AddPartitionsCommand,
    EndResult,
    EndTxnCommand,
    TransactionCoordinator,
)
from app.coordinator.transaction_metadata import TRANSACTION_VERSION_BUMP, TRANSACTION_VERSION_CLASSIC
from app.coordinator.write_batching import WriteBatcher
from app.errors import BrokerError
from app.storage.log import batch_form, markers, record_codec
from app.storage.log.append import BatchAppend
from app.storage.log.record_codec import EncodedBatch
from app.storage.log.topics import CONSUMER_OFFSETS_TOPIC, TopicInfo, find_topics, unknown_topic, unknown_topic_id
from app.storage.transactions import producer_ids
from app.storage.transactions.producer_ids import IssuedProducer


@dataclass(frozen=True, slots=True)
class _Produce:
    """A produce request checked and encoded, for a write batch to write."""

    command: ProduceCommand
    encoded: list[EncodedBatch]


@dataclass(frozen=True, slots=True)
class _Converted:
    """A produce's record batch in the stored form of its topic as read before the write batch's
    transaction (see the module's docstring)."""

    form: batch_form.StoredForm
    batch: EncodedBatch


# The bytes of records (decompressed, for a RecordBatch) from which a write batch converts its record
# batches before its transaction (see the module's docstring): below it, the work is far from the
# idle-in-transaction timeout even in the slowest form (zstd's highest level; docs/kafka.md, "A node
# dies", has the figures) and the extra read is not worth its round trip.
CONVERTED_AHEAD_BYTES = 1024 * 1024


def _conversion_bytes(batch: EncodedBatch) -> int:
    """The bytes its conversion into a stored form may have to go through."""
    return max(batch.size_bytes, batch.records_bytes)


def _in_stored_form(
    converted: _Converted | None, batch: EncodedBatch, topic: TopicInfo, appended_ms: int
) -> EncodedBatch:
    """The batch in the form `topic` (as the write batch's transaction read it) stores: the one
    converted ahead, if its topic's form is still the one it was converted for."""
    form = batch_form.stored_form(topic)
    if converted is not None and converted.form == form:
        return converted.batch
    return batch_form.in_stored_form(batch, form, appended_ms)


_Request = _Produce | EndTxnCommand | AddPartitionsCommand | AddOffsetsCommand
# A produce's results per partition, EndTxn's result, AddPartitionsToTxn's error per partition (None:
# added), AddOffsetsToTxn's None.
_Answer = list[PartitionResult] | EndResult | list[BrokerError | None] | None
_COORDINATOR_REQUESTS = (EndTxnCommand, AddPartitionsCommand, AddOffsetsCommand)


def _needs_transaction(requests: list[_Request]) -> bool:
    """A lone plain write to one partition is one statement after a read (the topic lookup):
    PostgreSQL runs that statement as a transaction of its own, so BEGIN and COMMIT would be two
    round trips for nothing. It is safe because the statement itself re-checks what the read found
    (it bumps the partition's row, which a deleted topic no longer has) and NOTIFY is still sent at
    its commit. Producers' writes (sequence state, the coordinator's row), writes to several
    partitions (all visible at once, or none), EndTxn and write batches of several requests keep
    their PostgreSQL transaction."""
    [first, *others] = requests
    return not (
        not others and isinstance(first, _Produce) and first.command.is_plain and len(first.command.partitions) == 1
    )


def _sharing_a_batch(requests: list[_Request]) -> int:
    """How many of the queued requests, from the first, one write batch writes: up to the first that
    writes for a transactional id whose EndTxn of transaction version 1 is before it among them.
    That epoch carries over, so such a request is not fenced: it begins the id's next transaction,
    whose record batches must follow the ended one's markers, as they would alone. A write batch
    writes its record batches before its markers, so a marker would cover them instead (the ended
    transaction's COMMIT making them visible, whatever their own transaction's outcome). After an
    EndTxn of version 2 the request still carries the ended epoch (the next one is in the EndTxn's
    answer, given after the commit) and is fenced in the batch; another EndTxn of the id (a retry)
    writes nothing: both share the batch."""
    ended: set[str] = set()
    for index, request in enumerate(requests):
        if isinstance(request, EndTxnCommand):
            if request.transaction_version == TRANSACTION_VERSION_CLASSIC:
                ended.add(request.transactional_id)
        elif (request.command.transactional_id if isinstance(request, _Produce) else request.transactional_id) in ended:
            return index
    return len(requests)


def _gone_topic_id(entry: PartitionRecords, topics: dict[str, TopicInfo]) -> BrokerError | None:
    """UNKNOWN_TOPIC_ID when the partition was named by a Kafka topic id (Produce v13+) that the topic
    of its name, as this write batch found it, no longer has: the door resolved the id to the name
    before (and remembers it), and the topic was deleted since, and maybe re-created."""
    if entry.topic_uuid is None:
        return None
    topic = topics.get(entry.topic)
    return None if topic is not None and topic.topic_uuid == entry.topic_uuid else unknown_topic_id(entry.topic_uuid)


class BatchedWrites:
    """Produce, EndTxn, AddPartitionsToTxn and AddOffsetsToTxn of one server process, written in write
    batches: the requests of a write batch share each statement (their producers and transactional
    ids looked up and locked together, their partitions locked together in lock_order, their record
    batches, markers and transaction log records written by one statement) and one commit."""

    def __init__(self, coordinator: TransactionCoordinator, max_records: int) -> None:
        self.coordinator = coordinator
        self.max_records = max_records
        self.batcher: WriteBatcher[_Request, _Answer] = WriteBatcher(self._write, sharing=_sharing_a_batch)

    async def produce(self, command: ProduceCommand) -> list[PartitionResult]:
        return await self.enqueue_produce(command)

    def enqueue_produce(self, command: ProduceCommand) -> asyncio.Future[list[PartitionResult]]:
        """Checks and encodes the produce and queues it for a write batch at once, behind every request
        queued before it (a Kafka connection's pipelined Produce requests keep their order this way):
        the future is its answer. Raises a request-level BrokerError, nothing queued."""
        check_request(command, self.max_records)
        appended_ms = now_ms()
        encoded = [
            entry.encoded
            or record_codec.encode_batch(entry.records, command.encoding, appended_ms, f"partitions[{index}].records")
            for index, entry in enumerate(command.partitions)
        ]
        return self.batcher.enqueue(_Produce(command, encoded))

    async def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        transaction_version: int = TRANSACTION_VERSION_BUMP,
    ) -> EndResult:
        """EndTxn: answers once every marker is written, with the producer id and epoch the next
        transaction uses (the same ones with TRANSACTION_VERSION_CLASSIC, Kafka's EndTxn below v5)."""
        return await self.batcher.submit(
            EndTxnCommand(transactional_id, producer_id, producer_epoch, commit, transaction_version)
        )

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        requested: list[tuple[str, int]],
        all_or_nothing: bool = False,
        refused: list[BrokerError | None] | None = None,
    ) -> list[BrokerError | None]:
        """AddPartitionsToTxn: each partition's error, or None once it is in the transaction (durably:
        answered after the write batch's commit); `all_or_nothing` and `refused` as
        AddPartitionsCommand's (then None is also a partition not attempted). Raises the request's
        error."""
        return await self.batcher.submit(
            AddPartitionsCommand(
                transactional_id, producer_id, producer_epoch, tuple(requested), all_or_nothing, tuple(refused or ())
            )
        )

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> None:
        """AddOffsetsToTxn: the group's __consumer_offsets partition joins the transaction (durably,
        as add_partitions). Raises the request's error."""
        await self.batcher.submit(AddOffsetsCommand(transactional_id, producer_id, producer_epoch, group_id))

    async def _write(self, requests: list[_Request]) -> list[_Answer | BrokerError]:
        """Writes a write batch in one PostgreSQL transaction: each request's answer, or its
        request-level error (a produce then appends nothing)."""
        coordinator = self.coordinator
        produces = [request.command for request in requests if isinstance(request, _Produce)]
        transactional_ids = {c.transactional_id for c in produces if c.transactional_id is not None}
        transactional_ids.update(r.transactional_id for r in requests if isinstance(r, _COORDINATOR_REQUESTS))
        idempotent = {c.producer_id for c in produces if not c.is_plain and c.transactional_id is None}
        adds_offsets = any(isinstance(r, AddOffsetsCommand) for r in requests)
        appended_ms = now_ms()  # the write batch's append time (Kafka's LogAppendTime)
        converted = await self._convert_ahead(requests, appended_ms)
        async with coordinator.unit_of_work(atomic=_needs_transaction(requests)) as unit:
            topic_names = {e.topic for c in produces for e in c.partitions}
            topic_names.update(t for r in requests if isinstance(r, AddPartitionsCommand) for t, _ in r.partitions)
            if adds_offsets:
                topic_names.add(CONSUMER_OFFSETS_TOPIC)
            # The coordinator's rows first (in id order), then the partitions (in lock_order), then
            # the transaction log: the unit of work's lock order.
            metas, topics = await unit.lock_many_and_find_topics(list(transactional_ids), sorted(topic_names))
            # Looked up with the others: produce never writes an internal topic (check_request refuses
            # it before the write batch), and adding partitions refuses it (_resolve_in).
            offsets_topic = topics.get(CONSUMER_OFFSETS_TOPIC)
            issued = await producer_ids.lookup_many(unit.conn, list(idempotent)) if idempotent else {}
            await _take_up_expired(unit.conn, produces, issued, appended_ms)
            answers: list[_Answer | BrokerError] = []
            appends: list[BatchAppend] = []
            owners: list[tuple[int, int]] = []  # (request, partition) of each append
            ends: list[markers.TransactionEnd] = []
            for request_index, request in enumerate(requests):
                try:
                    if isinstance(request, EndTxnCommand):
                        answer, ending = await coordinator.end_in_batch(
                            unit, metas.get(request.transactional_id), request
                        )
                        if ending is not None:
                            ends.append(ending)
                        answers.append(answer)
                        continue
                    if isinstance(request, AddPartitionsCommand):
                        meta = metas.get(request.transactional_id)
                        answers.append(coordinator.add_partitions_in_batch(meta, request, topics))
                        continue
                    if isinstance(request, AddOffsetsCommand):
                        coordinator.add_offsets_in_batch(metas.get(request.transactional_id), request, offsets_topic)
                        answers.append(None)
                        continue
                    command = request.command
                    # A partition named by the id of a topic since deleted (re-created under its name
                    # or not) is not the named topic's: none of it is written, nor joins a transaction.
                    gone = [_gone_topic_id(entry, topics) for entry in command.partitions]
                    if command.transactional_id is not None:
                        coordinator.join_for_produce(
                            metas.get(command.transactional_id),
                            command.transactional_id,
                            command.producer_id,
                            command.producer_epoch,
                            [(entry.topic, entry.partition) for entry, g in zip(command.partitions, gone) if g is None],
                            topics,
                        )
                    elif not command.is_plain:
                        stale = check_idempotent_producer(issued.get(command.producer_id), command)
                        if stale is not None:
                            answers.append([stale] * len(command.partitions))
                            continue
                except BrokerError as error:
                    answers.append(error)
                    continue
                results: list[PartitionResult | None] = []
                for partition_index, (entry, batch) in enumerate(zip(command.partitions, request.encoded)):
                    topic = topics.get(entry.topic)
                    if topic is None or gone[partition_index] is not None:
                        results.append(gone[partition_index] or unknown_topic(entry.topic))
                        continue
                    results.append(None)
                    owners.append((request_index, partition_index))
                    # In the form the topic stores (its codec and timestamps) as this write batch read
                    # its config: a change applies to the appends that read it, as in Kafka a batch
                    # validated just before a change keeps the old form (either is one any reader reads).
                    appends.append(
                        BatchAppend(
                            topic,
                            entry.partition,
                            _in_stored_form(converted.get((request_index, partition_index)), batch, topic, appended_ms),
                            command.producer_id,
                            command.producer_epoch,
                            entry.base_sequence,
                            command.transactional_id is not None,
                            appended_ms=appended_ms,
                            stateless_takes_any_sequence=command.takes_expired_producers,
                        )
                    )
                answers.append(results)
            # The transaction log's write goes with the record batches' and the markers' (one round trip),
            # last: see the unit of work's lock order.
            written = await unit.write_partitions_and_save(appends, ends, appended_ms)
            for (request_index, partition_index), result in zip(owners, written, strict=True):
                answers[request_index][partition_index] = result
        return answers

    async def _convert_ahead(self, requests: list[_Request], appended_ms: int) -> dict[tuple[int, int], _Converted]:
        """The write batch's record batches, by (request, partition), in their topics' stored forms
        as read now, when they carry CONVERTED_AHEAD_BYTES or more (see the module's docstring);
        else none."""
        produces = [(index, request) for index, request in enumerate(requests) if isinstance(request, _Produce)]
        if (
            sum(_conversion_bytes(batch) for _, produce in produces for batch in produce.encoded)
            < CONVERTED_AHEAD_BYTES
        ):
            return {}
        names = sorted({entry.topic for _, produce in produces for entry in produce.command.partitions})
        async with self.coordinator.pool.acquire() as conn:
            topics = await find_topics(conn, names)

        def convert() -> dict[tuple[int, int], _Converted]:
            converted: dict[tuple[int, int], _Converted] = {}
            for request_index, produce in produces:
                for partition_index, (entry, batch) in enumerate(zip(produce.command.partitions, produce.encoded)):
                    topic = topics.get(entry.topic)
                    if topic is not None:
                        form = batch_form.stored_form(topic)
                        converted[request_index, partition_index] = _Converted(
                            form, batch_form.in_stored_form(batch, form, appended_ms)
                        )
            return converted

        return await asyncio.to_thread(convert)


async def _take_up_expired(
    conn: asyncpg.Connection, produces: list[ProduceCommand], issued: dict[int, IssuedProducer], appended_ms: int
) -> None:
    """Adds to `issued` the expired idempotent ids that the write batch's commands take up again
    (ProduceCommand.takes_expired_producers), recorded at the epoch their batches carry."""
    by_principal: dict[str | None, dict[int, int]] = {}
    for command in produces:
        if (
            command.takes_expired_producers
            and command.transactional_id is None
            and not command.is_plain
            and command.producer_id not in issued
        ):
            by_principal.setdefault(command.principal, {}).setdefault(command.producer_id, command.producer_epoch)
    for principal, producers in by_principal.items():
        issued.update(await producer_ids.take_up_expired(conn, producers, appended_ms, principal))
