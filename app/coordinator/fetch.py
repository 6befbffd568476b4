"""Fetch and ListOffsets: reading the log. `fetch` reads several partitions at once, long-polling
(through the AppendNotifier every front door shares) until a record arrives or time is up;
`find_offsets` (ListOffsets) answers latest, earliest, or the first offset at or after a time, per partition."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.errors import BrokerError
from app.storage.log import partition_log
from app.storage.log.append_notifier import AppendNotifier
from app.storage.log.fetching import FetchPosition, PartitionFetch, fetch
from app.storage.log.partition_log import NO_OFFSET, NO_TIMESTAMP
from app.storage.log.topics import find_topics, unknown_topic

__all__ = [
    "NO_OFFSET",
    "NO_TIMESTAMP",
    "AppendNotifier",
    "FetchPosition",
    "OffsetFound",
    "PartitionFetch",
    "fetch",
    "find_offsets",
]


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
