"""Partition counts of topics, cached for `metadata_max_age_ms` (Kafka's metadata.max.age.ms): what
the producer's partitioner needs, fetched with GET /v1/topics/{topic}."""

from __future__ import annotations

import time
from urllib.parse import quote

from txbroker.connection import Connection
from txbroker.retry import Backoff, retrying


def topic_path(topic: str) -> str:
    return f"/v1/topics/{quote(topic, safe='')}"


class TopicMetadata:
    def __init__(self, connection: Connection, *, max_age_ms: int, backoff: Backoff, max_block_ms: int) -> None:
        self._connection = connection
        self._max_age_s = max_age_ms / 1000
        self._backoff = backoff
        self._max_block_s = max_block_ms / 1000
        self._partitions: dict[str, tuple[int, float]] = {}

    def partition_count(self, topic: str) -> int | None:
        """The cached count, or None when unknown or stale (then call `refresh`)."""
        cached = self._partitions.get(topic)
        if cached is None or time.monotonic() - cached[1] > self._max_age_s:
            return None
        return cached[0]

    def forget(self, topic: str) -> None:
        """A partition of the topic is unknown to the server (the topic was deleted, or re-created
        with fewer partitions): its count is asked again at the next send, as Kafka's producer
        refreshes its metadata on UNKNOWN_TOPIC_OR_PARTITION, not after metadata_max_age_ms."""
        self._partitions.pop(topic, None)

    async def refresh(self, topic: str) -> int:
        """Raises UnknownTopicOrPartitionError for a topic that does not exist."""
        count = await retrying(
            lambda: self._connection.request("GET", topic_path(topic), read=partition_count),
            what=f"metadata of topic {topic!r}",
            timeout_s=self._max_block_s,
            backoff=self._backoff,
        )
        self._partitions[topic] = (count, time.monotonic())
        return count


def partition_count(described: dict) -> int:
    """The partition count of a DescribeTopic answer."""
    return len(described["partitions"])
