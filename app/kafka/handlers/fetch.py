"""Fetch: whole stored batches as RecordBatches from the requested offset (a batch a Kafka client
produced as stored, its base offset written in; one written over HTTP or rewritten by compaction
rendered, in its topic's codec: compression.type), up to the last stable offset under
read_committed (else the high watermark), with markers as control batches and, under
read_committed, the aborted transactions among them (producer id, first offset), so that clients
skip aborted records and markers exactly as they do with Kafka. Long-polls for min_bytes up to
max_wait_ms. No fetch sessions (KIP-227): every answer has session id 0, which tells clients to
send full requests. From v13 topics are named by id (KIP-516): an id no topic has is answered
UNKNOWN_TOPIC_ID, and the core reads only the topic of the id."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.broker_calls import FetchedPartition, FetchPosition, unknown_topic_id
from app.kafka.context import RequestContext
from app.kafka.error_codes import READ_WHILE_DATABASE_UNAVAILABLE, kafka_error
from app.kafka.frames import build, response_module
from app.kafka.record_batches import control_batch, data_batch, stored_batch_at

READ_COMMITTED = 1
NO_SESSION = 0
NO_PREFERRED_REPLICA = -1
NO_OFFSET = -1
# Fetch v0-v2 had no max_bytes: the partitions' limits alone applied.
UNLIMITED_BYTES = 2**31 - 1
# From this version topics are named by id (KIP-516), in requests and responses.
TOPIC_IDS_SINCE = 13


def _records(fetched: FetchedPartition) -> bytes:
    parts: list = []
    for batch in fetched.batches:
        if batch.record_batch is not None:
            parts += stored_batch_at(batch.base_offset, batch.record_batch)
            continue
        if batch.control_type is not None:
            parts.append(
                control_batch(
                    batch.base_offset,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.control_type,
                    batch.first_timestamp_ms,
                )
            )
            continue
        rendered = data_batch(
            batch.base_offset,
            batch.last_offset,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.is_transactional,
            batch.records,
        )
        if rendered is not None:
            parts.append(fetched.in_topic_codec(rendered))
    return b"".join(parts)


def _aborted(module, fetched: FetchedPartition) -> tuple:
    """Each aborted transaction among the batches, as (producer id, the first offset of it they
    include), in log order. A client skips that producer's batches from there until the next ABORT
    marker of the producer, then forgets it: so every aborted transaction is an entry of its own,
    also when one producer aborted several in a row (each ends at its marker)."""
    entries = []
    open_aborted: set[int] = set()  # producers whose aborted transaction has begun and not ended here
    for batch in fetched.batches:
        if batch.control_type is not None:
            open_aborted.discard(batch.producer_id)
        elif batch.aborted and batch.producer_id not in open_aborted:
            open_aborted.add(batch.producer_id)
            entries.append(
                build(module, "AbortedTransaction", producer_id=batch.producer_id, first_offset=batch.base_offset)
            )
    return tuple(entries)


def _partition(module, fetched: FetchedPartition, read_committed: bool):
    state = fetched.state
    return build(
        module,
        "PartitionData",
        partition_index=fetched.position.partition,
        error_code=kafka_error(fetched.error, READ_WHILE_DATABASE_UNAVAILABLE),
        high_watermark=state.high_watermark if state else NO_OFFSET,
        last_stable_offset=state.last_stable_offset if state else NO_OFFSET,
        log_start_offset=state.log_start_offset if state else NO_OFFSET,
        aborted_transactions=_aborted(module, fetched) if read_committed else None,
        preferred_read_replica=NO_PREFERRED_REPLICA,
        # Empty, never null, with an error, as Kafka's read path answers (MemoryRecords.EMPTY):
        # librdkafka fails the whole response on a null records field.
        records=_records(fetched) if fetched.error is None else b"",
    )


async def handle(context: RequestContext, request) -> object:
    module = response_module(api_table.FETCH, context.api_version)
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    by_id = context.api_version >= TOPIC_IDS_SINCE
    names = await context.calls.topic_names({topic.topic_id for topic in request.topics}) if by_id else {}
    # By (topic id from v13, else name; partition). A partition named more than once is read once,
    # from its last mention's offset and bytes, and answered once, as Kafka's broker (its
    # FetchRequest.fetchData is a map by partition).
    asked: dict[tuple, tuple[str | None, FetchPosition]] = {}
    for topic in request.topics:
        name = names.get(topic.topic_id) if by_id else topic.topic
        for partition in topic.partitions:
            asked[(topic.topic_id if by_id else topic.topic, partition.partition)] = (
                name,
                FetchPosition(
                    name or "",
                    partition.partition,
                    partition.fetch_offset,
                    partition.partition_max_bytes,
                    topic.topic_id if by_id else None,
                ),
            )
    positions = [position for name, position in asked.values() if name is not None]
    unknown = [position for name, position in asked.values() if name is None]
    # A partition with an error answers at once, as the core's fetch does for its own errors.
    max_wait_ms = 0 if unknown else int(request.max_wait.total_seconds() * 1000)
    fetched = await context.calls.fetch(
        context.principal,
        positions,
        read_committed,
        max_wait_ms,
        request.min_bytes,
        getattr(request, "max_bytes", UNLIMITED_BYTES),
        context.read_ahead,
    )
    fetched += [FetchedPartition(position, error=unknown_topic_id(position.topic_uuid)) for position in unknown]
    by_topic: dict = {}  # by id from v13, else by name
    for result in fetched:
        key = result.position.topic_uuid if by_id else result.position.topic
        by_topic.setdefault(key, []).append(_partition(module, result, read_committed))
    return build(
        module,
        "FetchResponse",
        throttle_time=datetime.timedelta(0),
        error_code=KafkaError.none,
        session_id=NO_SESSION,
        responses=tuple(
            build(
                module,
                "FetchableTopicResponse",
                **({"topic_id": key} if by_id else {"topic": key}),
                partitions=tuple(partitions),
            )
            for key, partitions in by_topic.items()
        ),
    )
