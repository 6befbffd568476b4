"""Fetch and ListOffsets: reading the log. `fetch` reads several partitions' records at once,
long-polling (through the AppendNotifier every front door shares) until a record arrives or time is
up; `fetch_batches` reads whole stored batches, for a door that answers batches rather than
records, long-polling until enough bytes are read; `find_offsets` (ListOffsets) answers latest,
earliest, or the first offset at or after a time, per partition."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.log import batch_form, partition_log
from app.storage.log.append_notifier import AppendNotifier
from app.storage.log.batch_reads import StoredBatch, read_batches
from app.storage.log.fetching import FetchPosition, PartitionFetch, fetch
from app.storage.log.partition_log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    NO_OFFSET,
    NO_TIMESTAMP,
    PartitionState,
)
from app.storage.log.topics import TopicInfo, find_topics, unknown_partition, unknown_topic, unknown_topic_id
from txbroker.wire import READ_COMMITTED, READ_UNCOMMITTED

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "NO_OFFSET",
    "NO_TIMESTAMP",
    "AppendNotifier",
    "BatchFetchPosition",
    "FetchPosition",
    "FetchedBatches",
    "OffsetFound",
    "PartitionFetch",
    "StoredBatch",
    "fetch",
    "fetch_batches",
    "find_offsets",
]

# The most batches one partition's fetch reads in one statement (within the bytes asked for).
MAX_BATCHES_PER_READ = 200


@dataclass(frozen=True, slots=True)
class OffsetFound:
    """ListOffsets' answer for one partition: the offset and its record's timestamp (-1 when there
    is none), or why the partition could not be read."""

    topic: str
    partition: int
    offset: int = NO_OFFSET
    timestamp_ms: int = NO_TIMESTAMP
    error: BrokerError | None = None


async def find_offsets(
    pool: asyncpg.Pool, requested: list[tuple[str, int, int]], isolation_level: str
) -> list[OffsetFound]:
    """For each (topic, partition, timestamp): latest (-1: the high watermark, or the last stable
    offset under read_committed), earliest (-2), or the first offset whose timestamp is at or
    after a time."""
    answers = []
    async with pool.acquire() as conn:
        topics = await find_topics(conn, sorted({topic for topic, _, _ in requested}))
        for topic_name, partition, timestamp in requested:
            try:
                topic = topics.get(topic_name)
                if topic is None:
                    raise unknown_topic(topic_name)
                offset, timestamp_ms = await partition_log.offset_for(
                    conn, topic, partition, timestamp, isolation_level
                )
                answers.append(OffsetFound(topic_name, partition, offset, timestamp_ms))
            except BrokerError as error:
                answers.append(OffsetFound(topic_name, partition, error=error))
    return answers


@dataclass(frozen=True, slots=True)
class BatchFetchPosition:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    # Kafka's Fetch v13+ names topics by id: then only the topic of that id is read, so a topic
    # deleted and re-created under the name since the caller resolved the id is UNKNOWN_TOPIC_ID.
    topic_uuid: uuid.UUID | None = None


@dataclass(slots=True)
class FetchedBatches:
    """One partition's answer to fetch_batches: its batches from the offset asked, or why none."""

    position: BatchFetchPosition
    error: BrokerError | None = None
    state: PartitionState | None = None
    batches: list[StoredBatch] = field(default_factory=list)
    # The codec its topic's batches are sent in (compression.type; the producer's own: none).
    codec: batch_form.TopicCodec = batch_form.PRODUCERS_CODEC

    def in_topic_codec(self, rendered: bytes) -> bytes:
        """A batch the door rendered from the JSON form (uncompressed) in the codec its topic sends,
        so that every data batch of a topic with a codec comes in it, whichever door produced it."""
        # Uncompressed, it is never decompressed: its own length bounds its records.
        return batch_form.in_codec(rendered, self.codec, len(rendered))

    @property
    def size(self) -> int:
        return sum(batch.size_bytes for batch in self.batches)


async def fetch_batches(
    pool: asyncpg.Pool,
    notifier: AppendNotifier,
    positions: list[BatchFetchPosition],
    refused: dict[str, BrokerError | None],
    read_committed: bool,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
) -> list[FetchedBatches]:
    """Whole stored batches of each position, at most max_bytes in all (and each position's own
    max_bytes), the first batch always (a reader must make progress whatever the sizes). Returns
    once the batches read reach min_bytes (or any partition has an error), else once max_wait_ms
    has passed, re-reading whenever one of the partitions gets an append. `refused`: the error of
    each topic the caller may not read (None for the others); its positions are answered with it,
    not read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    results, found = await _read_batches(pool, positions, refused, read_committed, max_bytes)

    def done() -> bool:
        return (
            loop.time() >= deadline
            or any(r.error is not None for r in results)
            or sum(r.size for r in results) >= max(min_bytes, 1)
        )

    if done():
        return results
    watched = [(found[p.topic].topic_id, p.partition) for p in positions if p.topic in found]
    with notifier.watching(watched) as appended:
        while True:
            appended.clear()
            results, _ = await _read_batches(pool, positions, refused, read_committed, max_bytes)
            if done():
                return results
            try:
                await asyncio.wait_for(appended.wait(), min(deadline - loop.time(), notifier.fallback_s))
            except TimeoutError:
                pass


async def _read_batches(
    pool: asyncpg.Pool,
    positions: list[BatchFetchPosition],
    refused: dict[str, BrokerError | None],
    read_committed: bool,
    max_bytes: int,
) -> tuple[list[FetchedBatches], dict[str, TopicInfo]]:
    results = []
    budget = max_bytes
    async with pool.acquire() as conn:
        found, states = await partition_log.topics_and_states(conn, [(p.topic, p.partition) for p in positions])
        for position in positions:
            result = FetchedBatches(position, error=refused[position.topic])
            results.append(result)
            topic = found.get(position.topic)
            if result.error is not None:
                continue
            if position.topic_uuid is not None and (topic is None or topic.topic_uuid != position.topic_uuid):
                result.error = unknown_topic_id(position.topic_uuid)
                continue
            if topic is None:
                result.error = unknown_topic(position.topic)
                continue
            state = states.get((position.topic, position.partition))
            if state is None:
                result.error = unknown_partition(topic, position.partition)
                continue
            result.state = state
            result.codec = batch_form.topic_codec(topic)
            if not state.log_start_offset <= position.offset <= state.high_watermark:
                result.error = BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {position.offset} is outside {topic.name}-{position.partition}: expected "
                    f"{state.log_start_offset} to {state.high_watermark}",
                )
                continue
            upper = state.upper_bound(READ_COMMITTED if read_committed else READ_UNCOMMITTED)
            # Kafka's KIP-74: the first partition that returns batches gets its first batch whatever
            # the limits (a reader must make progress); every partition after it only batches that
            # fit both its own max_bytes and what is left of the fetch's.
            exempt = not any(earlier.batches for earlier in results)
            limit = min(position.max_bytes, budget)
            if position.offset >= upper or (limit <= 0 and not exempt):
                continue
            batches = await read_batches(
                conn, topic, position.partition, position.offset, upper, MAX_BATCHES_PER_READ, limit, read_committed
            )
            # read_batches returns a first batch whatever its size: past the exempt partition, one
            # that does not fit is not sent (Kafka sends it cut short, which clients discard).
            result.batches = batches if exempt or not batches or batches[0].size_bytes <= limit else []
            budget -= result.size
    return results, found
