"""The observability of transactions on a partition (KIP-664's DescribeProducers, and the markers
a partition holds). ListTransactions, DescribeTransactions and the admin abort are the
TransactionCoordinator's (they lock or read its rows)."""

from __future__ import annotations

import asyncpg

from app.storage.log import markers
from app.storage.log.markers import Marker
from app.storage.log.topics import TopicInfo, get_topic, unknown_partition
from app.storage.transactions import producer_ids
from app.storage.transactions.producer_ids import PartitionProducer, ProducerIdAndEpoch

__all__ = ["Marker", "PartitionProducer", "ProducerIdAndEpoch", "describe_producers", "list_markers"]


async def _partition(conn: asyncpg.Connection, topic: str, partition: int) -> TopicInfo:
    info = await get_topic(conn, topic)
    if not 0 <= partition < info.partition_count:
        raise unknown_partition(info, partition)
    return info


async def describe_producers(pool: asyncpg.Pool, topic: str, partition: int) -> list[PartitionProducer]:
    """[DescribeProducers] The producers with state on this partition."""
    async with pool.acquire() as conn:
        info = await _partition(conn, topic, partition)
        return await producer_ids.describe_partition_producers(conn, info.topic_id, partition)


async def list_markers(pool: asyncpg.Pool, topic: str, partition: int, offset: int, limit: int) -> list[Marker]:
    """The transaction markers of a partition from an offset on."""
    async with pool.acquire() as conn:
        info = await _partition(conn, topic, partition)
        return await markers.list_markers(conn, info.topic_id, partition, offset, limit)
