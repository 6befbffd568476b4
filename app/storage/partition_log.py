"""The partition log: append batches with dense offsets, read them back, find offsets.

Invariants:
- Offsets of a partition are dense and unique: an append first bumps the partition's
  `high_watermark` (taking that row's lock until commit), then inserts its batch at the old value, in
  one statement. Concurrent appends to one partition therefore queue on the row; appends to other
  partitions never wait. A multi-partition append locks its partitions in (topic_id, partition)
  order, so two of them cannot deadlock.
- A reader sees a batch exactly when it sees the high watermark that covers it (same PostgreSQL
  transaction), and bounds every read by the watermark it read first, so it never sees a hole.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage import record_codec
from app.storage.record_codec import EncodedBatch
from app.storage.topics import TopicInfo, unknown_partition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
NO_OFFSET = -1
NO_TIMESTAMP = -1

APPENDS_CHANNEL = "txbroker_appends"


def notification_key(topic_id: int, partition: int) -> str:
    return f"{topic_id}:{partition}"


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """One partition's part of a produce request, validated and encoded."""
    topic: TopicInfo
    partition: int
    batch: EncodedBatch
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    is_transactional: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int

    def upper_bound(self, isolation_level: str) -> int:
        """The first offset a reader at this isolation level may not see."""
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark


@dataclass(slots=True)
class ReadResult:
    state: PartitionState
    records: list[dict]
    next_offset: int


# Bumps the high watermark (locking the partition's row until commit), inserts the batch at the old
# one, and tells long-polling fetches on every server (NOTIFY is delivered at commit).
_APPEND_SQL = f"""
WITH head AS (
    UPDATE partitions SET high_watermark = high_watermark + $3
    WHERE topic_id = $1 AND partition = $2
    RETURNING high_watermark - $3 AS base_offset
), appended AS (
    INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id,
        producer_epoch, base_sequence, is_transactional, control_type, first_timestamp_ms,
        max_timestamp_ms, record_count, size_bytes, records)
    SELECT $1, $2, base_offset, base_offset + $3 - 1, $4, $5, $6, $7, NULL, $8, $9, $3, $10, $11 FROM head
    RETURNING base_offset, last_offset
)
SELECT base_offset, last_offset, pg_notify('{APPENDS_CHANNEL}', $1::text || ':' || $2::text) FROM appended
"""


def check_appendable(append: BatchAppend) -> BrokerError | None:
    """The partition-level checks that need no database: partition exists, records fit."""
    topic = append.topic
    if not 0 <= append.partition < topic.partition_count:
        return unknown_partition(topic, append.partition)
    if append.batch.largest_record_bytes > topic.max_message_bytes:
        return BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a record of {append.batch.largest_record_bytes} bytes (key, value and headers) was sent "
            f"to {topic.name}-{append.partition}, whose max_message_bytes is {topic.max_message_bytes}: "
            f"send smaller records or create the topic with a larger max_message_bytes")
    return None


async def append_batch(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult:
    """Appends one batch; the caller holds a PostgreSQL transaction and orders its appends."""
    batch = append.batch
    row = await conn.fetchrow(
        _APPEND_SQL, append.topic.topic_id, append.partition, batch.record_count,
        append.producer_id, append.producer_epoch, append.base_sequence, append.is_transactional,
        batch.first_timestamp_ms, batch.max_timestamp_ms, batch.size_bytes, batch.payload)
    if row is None:  # the topic was deleted since it was looked up
        raise unknown_partition(append.topic, append.partition)
    return AppendResult(row["base_offset"], row["last_offset"])


async def partition_state(conn: asyncpg.Connection, topic: TopicInfo, partition: int) -> PartitionState:
    if not 0 <= partition < topic.partition_count:
        raise unknown_partition(topic, partition)
    row = await conn.fetchrow(
        "SELECT high_watermark, log_start_offset FROM partitions WHERE topic_id = $1 AND partition = $2",
        topic.topic_id, partition)
    if row is None:
        raise unknown_partition(topic, partition)
    return PartitionState(row["high_watermark"], row["log_start_offset"], row["high_watermark"])


async def partition_states(conn: asyncpg.Connection, topics: list[TopicInfo]) -> dict[int, list[PartitionState]]:
    """The states of every partition of these topics, by topic_id, in one query."""
    rows = await conn.fetch(
        "SELECT topic_id, high_watermark, log_start_offset FROM partitions WHERE topic_id = ANY($1::int[]) "
        "ORDER BY topic_id, partition", [topic.topic_id for topic in topics])
    states: dict[int, list[PartitionState]] = {topic.topic_id: [] for topic in topics}
    for row in rows:
        states[row["topic_id"]].append(
            PartitionState(row["high_watermark"], row["log_start_offset"], row["high_watermark"]))
    return states


def _offset_out_of_range(topic: TopicInfo, partition: int, offset: int, state: PartitionState) -> BrokerError:
    return BrokerError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"offset {offset} is outside {topic.name}-{partition}: expected {state.log_start_offset} "
        f"(log_start_offset) to {state.high_watermark} (high_watermark); reset to one of them "
        f"(POST /v1/offsets/list)")


async def read(conn: asyncpg.Connection, topic: TopicInfo, partition: int, offset: int,
               max_records: int, isolation_level: str, encoding: str) -> ReadResult:
    state = await partition_state(conn, topic, partition)
    if not state.log_start_offset <= offset <= state.high_watermark:
        raise _offset_out_of_range(topic, partition, offset, state)
    upper = state.upper_bound(isolation_level)
    if offset >= upper or max_records <= 0:  # a spent budget still reports the watermarks
        return ReadResult(state, [], offset)
    # Every batch holds at least one offset, so max_records batches always hold enough records.
    batches = await conn.fetch(
        "SELECT base_offset, last_offset, control_type, records FROM record_batches "
        "WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND base_offset < $4 "
        "ORDER BY last_offset LIMIT $5",
        topic.topic_id, partition, offset, upper, max_records)
    records: list[dict] = []
    next_offset = offset
    for batch in batches:
        if batch["control_type"] is not None:
            next_offset = batch["last_offset"] + 1
            continue
        base = batch["base_offset"]
        stored = record_codec.decode_payload(batch["records"])
        start = max(offset - base, 0)
        stop = min(len(stored), start + max_records - len(records))
        for index in range(start, stop):
            records.append(record_codec.render_record(stored[index], base + index, encoding))
        next_offset = base + stop
        if len(records) >= max_records:
            break
    return ReadResult(state, records, next_offset)


async def offset_for(conn: asyncpg.Connection, topic: TopicInfo, partition: int, timestamp: int,
                     isolation_level: str) -> tuple[int, int]:
    """ListOffsets: (offset, timestamp_ms) for latest (-1), earliest (-2) or a time in ms."""
    state = await partition_state(conn, topic, partition)
    upper = state.upper_bound(isolation_level)
    if timestamp == LATEST_TIMESTAMP:
        return upper, NO_TIMESTAMP
    if timestamp == EARLIEST_TIMESTAMP:
        return state.log_start_offset, NO_TIMESTAMP
    # Batches are not ordered by time, so walk them in log order to the first that reaches it.
    batch = await conn.fetchrow(
        "SELECT base_offset, records FROM record_batches WHERE topic_id = $1 AND partition = $2 "
        "AND control_type IS NULL AND max_timestamp_ms >= $3 AND base_offset < $4 "
        "AND last_offset >= $5 ORDER BY last_offset LIMIT 1",
        topic.topic_id, partition, timestamp, upper, state.log_start_offset)
    if batch is None:
        return NO_OFFSET, NO_TIMESTAMP
    for index, stored in enumerate(record_codec.decode_payload(batch["records"])):
        if stored[0] >= timestamp:
            return batch["base_offset"] + index, stored[0]
    raise AssertionError("a batch whose max_timestamp_ms reaches the time has a record that does")


async def append_batches(conn: asyncpg.Connection, appends: list[BatchAppend]) -> list[AppendResult | BrokerError]:
    """Appends a produce request's batches in one PostgreSQL transaction: each entry's result or
    partition-level error, in request order. Nothing is visible to readers before all are durable."""
    results: list[AppendResult | BrokerError | None] = [check_appendable(append) for append in appends]
    lock_order = sorted((i for i, result in enumerate(results) if result is None),
                        key=lambda i: (appends[i].topic.topic_id, appends[i].partition))
    async with conn.transaction():
        for index in lock_order:
            try:
                results[index] = await append_batch(conn, appends[index])
            except BrokerError as error:
                results[index] = error
    return results
