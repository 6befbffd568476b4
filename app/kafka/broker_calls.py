"""Every call the Kafka door makes into the app's operations, in one module: the only one of
app/kafka that imports app.coordinator or app.storage (pyproject's import contracts), so that the
door can be re-pointed at the application core in one place.

Each call takes what a handler parsed (plain values, record_batches' types) and returns results
or BrokerErrors (app/errors.py) per partition, which the handlers turn into Kafka's error codes.
The writing path is HTTP's: a produce is a ProduceCommand through the same WriteGroups, so the
sequence checks, fencing and transaction rules are the ones HTTP gets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from app.clock import now_ms
from app.coordinator.authorizer import (
    ANONYMOUS,
    CLUSTER_RESOURCE,
    Operation,
    Principal,
    ResourceType,
    authorize,
    is_allowed,
)
from app.coordinator.produce import PartitionRecords, ProduceCommand
from app.coordinator.transaction_coordinator import TRANSACTION_VERSION_BUMP, TRANSACTION_VERSION_CLASSIC
from app.errors import BrokerError, ErrorCode
from app.kafka.record_batches import KafkaRecord, ProducedBatch
from app.settings import Settings
from app.storage import partition_log, principals, record_codec, topics
from app.storage.batch_reads import StoredBatch, read_batches
from app.storage.group_offsets import OffsetEntry
from app.storage.partition_log import READ_COMMITTED, READ_UNCOMMITTED, AppendResult, PartitionState

# Kafka's num.partitions default: the partitions of a topic Metadata creates.
AUTO_CREATED_PARTITIONS = 1
# The most batches one partition's fetch reads in one statement (within the bytes asked for).
MAX_BATCHES_PER_READ = 200
# With auth required, Kafka connections have no credentials yet (SASL is not built): they are this
# principal, a super user of nothing, so every authorized operation is refused.
UNAUTHENTICATED = Principal("ANONYMOUS")


def connection_principal(settings: Settings) -> Principal:
    return UNAUTHENTICATED if settings.auth == "required" else ANONYMOUS


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error: BrokerError | None
    partition_count: int = 0
    is_internal: bool = False


@dataclass(frozen=True, slots=True)
class ProducedPartition:
    topic: str
    partition: int
    batch: ProducedBatch


@dataclass(frozen=True, slots=True)
class FetchPosition:
    topic: str
    partition: int
    offset: int
    max_bytes: int


@dataclass(slots=True)
class FetchedPartition:
    position: FetchPosition
    error: BrokerError | None = None
    state: PartitionState | None = None
    batches: list[StoredBatch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(batch.size_bytes for batch in self.batches)


@dataclass(frozen=True, slots=True)
class AddedPartitions:
    """Per requested partition, its error or None; with `attempted` False, None means not attempted."""

    errors: list[BrokerError | None]
    attempted: bool


@dataclass(frozen=True, slots=True)
class TxnOffset:
    topic: str
    partition: int
    offset: int
    metadata: str | None


@dataclass(frozen=True, slots=True)
class EndedTransaction:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp_ms: int


def _denied(principal: Principal, operation: Operation, resource: ResourceType, name: str) -> BrokerError | None:
    try:
        authorize(principal, operation, resource, name)
    except BrokerError as error:
        return error
    return None


class BrokerCalls:
    """The app's operations as one listener sees them (one per server process; `state` is the
    FastAPI app's state: pool, write_groups, coordinator, notifier, settings)."""

    def __init__(self, state) -> None:
        self._state = state

    @property
    def settings(self) -> Settings:
        return self._state.settings

    @property
    def ready(self) -> bool:
        return self._state.ready

    async def topic_metadata(self, principal: Principal, names: list[str] | None, allow_create: bool):
        """The named topics (None: every topic the principal may Describe), creating unknown ones
        when allowed (Kafka's auto.create.topics.enable and the request's flag) with Kafka's defaults."""
        async with self._state.pool.acquire() as conn:
            if names is None:
                return [
                    TopicMetadata(t.name, None, t.partition_count, t.is_internal)
                    for t in await topics.list_topics(conn)
                    if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, t.name)
                ]
            found = await topics.find_topics(conn, names)
            results = []
            for name in names:
                denied = _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, name)
                topic = found.get(name)
                if denied is None and topic is None and allow_create and self.settings.kafka_auto_create_topics:
                    topic, denied = await self._auto_create(conn, principal, name)
                if denied is not None:
                    results.append(TopicMetadata(name, denied))
                elif topic is None:
                    results.append(TopicMetadata(name, topics.unknown_topic(name)))
                else:
                    results.append(TopicMetadata(name, None, topic.partition_count, topic.is_internal))
            return results

    async def _auto_create(self, conn, principal: Principal, name: str):
        if not is_allowed(principal, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            denied = _denied(principal, Operation.CREATE, ResourceType.TOPIC, name)
            if denied is not None:
                return None, denied
        try:
            async with conn.transaction():  # the audit entry is part of the change, as over HTTP
                topic = await topics.create_topic(
                    conn, name, AUTO_CREATED_PARTITIONS, {}, defaults=self.settings.topic_defaults()
                )
                await principals.audit(
                    conn, now_ms(), principal.name, "create topic", name, "auto-created by a Kafka Metadata request"
                )
            return topic, None
        except BrokerError as error:
            if error.code == ErrorCode.TOPIC_ALREADY_EXISTS:  # a concurrent request created it first
                return await topics.find_topic(conn, name), None
            return None, error

    async def init_producer_id(
        self, principal: Principal, transactional_id: str | None, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        if principal is UNAUTHENTICATED:  # over HTTP, any authenticated caller may be an idempotent producer
            raise BrokerError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "this server requires credentials, and its Kafka listener cannot take them yet (no SASL): "
                "produce over HTTP with an API key",
            )
        if transactional_id is not None:
            authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        result = await self._state.coordinator.init_producer_id(
            transactional_id,
            timeout_ms,
            producer_id,
            epoch,
            quota_principal=None if principal.is_super_user else principal.name,
        )
        return result.producer_id, result.producer_epoch

    async def add_partitions_to_txn(
        self,
        principal: Principal,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        requested: list[tuple[str, int]],
    ) -> AddedPartitions:
        """AddPartitionsToTxn. Refused as a whole when the transactional id may not be written; when a
        topic may not be written, its partitions are refused and the others not attempted (Kafka's
        OPERATION_NOT_ATTEMPTED): nothing is added."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        denied = [_denied(principal, Operation.WRITE, ResourceType.TOPIC, topic) for topic, _ in requested]
        if any(denied):
            return AddedPartitions(denied, attempted=False)
        errors = await self._state.coordinator.add_partitions(transactional_id, producer_id, producer_epoch, requested)
        return AddedPartitions(errors, attempted=True)

    async def add_offsets_to_txn(
        self, principal: Principal, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        await self._state.coordinator.add_offsets(transactional_id, producer_id, producer_epoch, group_id)

    async def txn_offset_commit(
        self,
        principal: Principal,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        offsets: list[TxnOffset],
    ) -> list[BrokerError | None]:
        """TxnOffsetCommit: one error or None per offset. With a generation (KIP-447, v3+) a zombie
        member's commit is refused; generation -1 (older versions) skips that check, as Kafka does."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        denied = {
            topic: _denied(principal, Operation.READ, ResourceType.TOPIC, topic) for topic in {o.topic for o in offsets}
        }
        allowed = [o for o in offsets if denied[o.topic] is None]
        errors = await self._state.group_coordinator.txn_offset_commit(
            transactional_id,
            group_id,
            producer_id,
            producer_epoch,
            generation_id,
            member_id,
            [OffsetEntry(o.topic, o.partition, o.offset, o.metadata) for o in allowed],
        )
        by_offset = dict(zip(map(id, allowed), errors))
        return [denied[o.topic] or by_offset[id(o)] for o in offsets]

    async def end_txn(
        self,
        principal: Principal,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        epoch_bump: bool,
    ) -> EndedTransaction:
        """EndTxn. `epoch_bump`: KIP-890's transaction version 2 (EndTxn v5+, as HTTP), which answers
        the producer id and epoch of the next transaction; else version 1, the ids carrying over."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        result = await self._state.write_groups.end_transaction(
            transactional_id,
            producer_id,
            producer_epoch,
            commit,
            TRANSACTION_VERSION_BUMP if epoch_bump else TRANSACTION_VERSION_CLASSIC,
        )
        return EndedTransaction(result.producer_id, result.producer_epoch)

    async def produce(
        self, principal: Principal, transactional_id: str | None, partitions: list[ProducedPartition]
    ) -> list[AppendResult | BrokerError]:
        """One result per partition, in order. The partitions' batches are written together when
        they share a producer (as every client sends them), else in one command per producer."""
        results: list[AppendResult | BrokerError | None] = [None] * len(partitions)
        for index, entry in enumerate(partitions):
            results[index] = _denied(principal, Operation.WRITE, ResourceType.TOPIC, entry.topic)
        if transactional_id is not None:
            denied = _denied(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
            results = [result or denied for result in results]
        by_producer: dict[tuple[int, int], list[int]] = {}
        for index, entry in enumerate(partitions):
            if results[index] is None:
                by_producer.setdefault((entry.batch.producer_id, entry.batch.producer_epoch), []).append(index)
        for (producer_id, producer_epoch), indexes in by_producer.items():
            command = ProduceCommand(
                transactional_id,
                producer_id,
                producer_epoch,
                record_codec.BASE64,
                [
                    PartitionRecords(
                        partitions[i].topic,
                        partitions[i].partition,
                        partitions[i].batch.base_sequence,
                        partitions[i].batch.records,
                        record_codec.encode_byte_records(
                            [record_codec.ByteRecord(*record) for record in partitions[i].batch.records]
                        ),
                    )
                    for i in indexes
                ],
            )
            try:
                written = await self._state.write_groups.produce(command)
            except BrokerError as error:  # request-level: nothing of this command was written
                written = [error] * len(indexes)
            for index, result in zip(indexes, written):
                results[index] = result
        self._state.metrics.records_produced.inc(
            sum(
                len(entry.batch.records)
                for entry, result in zip(partitions, results)
                if isinstance(result, AppendResult) and not result.duplicate
            )
        )
        return results

    async def fetch(
        self,
        principal: Principal,
        positions: list[FetchPosition],
        read_committed: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
    ) -> list[FetchedPartition]:
        """Kafka's Fetch: returns once the batches read reach min_bytes (or any partition has an
        error), else once max_wait_ms (capped by the server's max_wait_ms) has passed, re-reading
        whenever one of the partitions gets an append (the notifier HTTP's long polls use)."""
        denied = {
            topic: _denied(principal, Operation.READ, ResourceType.TOPIC, topic)
            for topic in {p.topic for p in positions}
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max_wait_ms, self.settings.max_wait_ms) / 1000
        results, found = await self._read(positions, denied, read_committed, max_bytes)

        def done() -> bool:
            return (
                loop.time() >= deadline
                or any(r.error is not None for r in results)
                or sum(r.size for r in results) >= max(min_bytes, 1)
            )

        if done():
            return self._counted(results)
        notifier = self._state.notifier
        watched = [(found[p.topic].topic_id, p.partition) for p in positions if p.topic in found]
        with notifier.watching(watched) as appended:
            while True:
                appended.clear()
                results, _ = await self._read(positions, denied, read_committed, max_bytes)
                if done():
                    return self._counted(results)
                try:
                    await asyncio.wait_for(appended.wait(), min(deadline - loop.time(), notifier.fallback_s))
                except TimeoutError:
                    pass

    def _counted(self, results: list[FetchedPartition]) -> list[FetchedPartition]:
        self._state.metrics.records_fetched.inc(
            sum(len(batch.records) for r in results for batch in r.batches if batch.control_type is None)
        )
        return results

    async def _read(self, positions: list[FetchPosition], denied: dict, read_committed: bool, max_bytes: int):
        results = []
        budget = max_bytes
        async with self._state.pool.acquire() as conn:
            found, states = await partition_log.topics_and_states(conn, [(p.topic, p.partition) for p in positions])
            for position in positions:
                result = FetchedPartition(position, error=denied[position.topic])
                results.append(result)
                topic = found.get(position.topic)
                if result.error is not None:
                    continue
                if topic is None:
                    result.error = topics.unknown_topic(position.topic)
                    continue
                state = states.get((position.topic, position.partition))
                if state is None:
                    result.error = topics.unknown_partition(topic, position.partition)
                    continue
                result.state = state
                if not state.log_start_offset <= position.offset <= state.high_watermark:
                    result.error = BrokerError(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"offset {position.offset} is outside {topic.name}-{position.partition}: expected "
                        f"{state.log_start_offset} to {state.high_watermark}",
                    )
                    continue
                upper = state.upper_bound(READ_COMMITTED if read_committed else READ_UNCOMMITTED)
                if position.offset >= upper or budget <= 0:
                    continue
                result.batches = await read_batches(
                    conn,
                    topic,
                    position.partition,
                    position.offset,
                    upper,
                    MAX_BATCHES_PER_READ,
                    min(position.max_bytes, budget),
                    read_committed,
                )
                budget -= result.size
        return results, found

    async def list_offset(
        self, principal: Principal, topic_name: str, partition: int, timestamp: int, read_committed: bool
    ) -> ListedOffset:
        """Kafka's ListOffsets for one partition: latest (-1), earliest (-2) or by time."""
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic_name)
        async with self._state.pool.acquire() as conn:
            topic = await topics.get_topic(conn, topic_name)
            offset, found_ms = await partition_log.offset_for(
                conn, topic, partition, timestamp, READ_COMMITTED if read_committed else READ_UNCOMMITTED
            )
        return ListedOffset(offset, found_ms)


def byte_records(batch: StoredBatch) -> list[KafkaRecord | None]:
    return [
        None if record is None else KafkaRecord(record.timestamp_ms, record.key, record.value, record.headers)
        for record in batch.records
    ]
