"""The observability of transactions (KIP-664): ListTransactions with its filters and the caller's
ACLs, DescribeProducers of partitions, and the markers a partition holds. DescribeTransactions and
the admin abort are the TransactionCoordinator's (they lock or read its rows); both doors call
these, so a filter means the same over HTTP and Kafka."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from app.coordinator.confirmed_reads import confirmed_by_the_standby, reads_confirmed_by_the_standby
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.coordinator.transaction_metadata import TransactionMetadata
from app.errors import BrokerError, DatabaseUnavailable
from app.storage.log import markers
from app.storage.log.markers import Marker
from app.storage.log.topics import TopicInfo, get_topic, unknown_partition
from app.storage.transactions import producer_ids
from app.storage.transactions.producer_ids import PartitionProducer, ProducerIdAndEpoch
from app.storage.transactions.transaction_log import InvalidIdPattern

__all__ = [
    "InvalidIdPattern",
    "Marker",
    "PartitionProducer",
    "ProducerIdAndEpoch",
    "TransactionFilter",
    "describe_producers",
    "describe_producers_of",
    "list_markers",
    "list_transactions",
]

# Rows read per round trip while listing everything (Kafka's ListTransactions has no limit).
LIST_PAGE = 1000


@dataclass(frozen=True, slots=True)
class TransactionFilter:
    """What ListTransactions selects; None (or empty) selects everything for that criterion."""

    states: list[str] | None = None  # persisted state names (TransactionState values)
    prefix: str | None = None
    producer_ids: frozenset[int] | None = None
    min_duration_ms: int | None = None  # open at least this long (a transaction with no start never is)
    # Kafka's transactional id pattern (ListTransactions v2): a regular expression the whole id
    # matches, as Java's Pattern.matches; matched by PostgreSQL (transaction_log.InvalidIdPattern).
    id_pattern: str | None = None

    def admits(self, meta: TransactionMetadata) -> bool:
        """The criterion the listing's SQL does not apply (all producer ids but one)."""
        return not self.producer_ids or meta.producer_id in self.producer_ids


async def list_transactions(
    coordinator: TransactionCoordinator,
    wanted: TransactionFilter,
    visible: Callable[[str], bool],
    limit: int | None = None,
    after: str | None = None,
) -> list[TransactionMetadata]:
    """[ListTransactions] The transactions `wanted` selects whose ids `visible` admits (the
    caller's Describe ACL), ordered by transactional id, after `after`, at most `limit` (None: all).
    The filters apply before the limit: pages are read until `limit` are found or the listing
    ends, so a short answer always means the last page. Answered once the synchronous standby has
    what was read (DatabaseUnavailable, retriable, if it has not within READ_WAIT_MIN_S)."""
    page_size = LIST_PAGE if limit is None else limit
    single_producer = next(iter(wanted.producer_ids)) if wanted.producer_ids and len(wanted.producer_ids) == 1 else None
    found: list[TransactionMetadata] = []
    while limit is None or len(found) < limit:
        page = await coordinator.list(
            wanted.states, wanted.prefix, single_producer, wanted.min_duration_ms, page_size, after, wanted.id_pattern
        )
        found += [meta for meta in page if wanted.admits(meta) and visible(meta.transactional_id)]
        if len(page) < page_size:
            break
        after = page[-1].transactional_id
    # Once for every page read: a transaction listed CompleteCommit must not come back Ongoing.
    await confirmed_by_the_standby(coordinator.replication_barrier, "the transactions' states")
    return found if limit is None else found[:limit]


async def _partition(conn: asyncpg.Connection, topic: str, partition: int) -> TopicInfo:
    info = await get_topic(conn, topic)
    if not 0 <= partition < info.partition_count:
        raise unknown_partition(info, partition)
    return info


async def describe_producers(
    coordinator: TransactionCoordinator, topic: str, partition: int
) -> list[PartitionProducer]:
    """[DescribeProducers] The producers with state on this partition."""
    [found] = await describe_producers_of(coordinator, topic, [partition])
    if isinstance(found, BrokerError):
        raise found
    return found


async def describe_producers_of(
    coordinator: TransactionCoordinator, topic: str, partitions: list[int]
) -> list[list[PartitionProducer] | BrokerError]:
    """[DescribeProducers] Per partition of the topic, its producers with state, or
    UNKNOWN_TOPIC_OR_PARTITION. Each partition is read on its own (a partition's producer states
    change only under its row lock, with the append or marker that changes them). Answered once the
    synchronous standby has what was read: a producer shown in a
    transaction, or none, that a failover takes back would mislead an operator deciding on an
    abort, and so would a topic or partition not found (a deletion the standby lacks comes back);
    each partition asked is DatabaseUnavailable (retriable) if it has not within READ_WAIT_MIN_S."""
    found: list[list[PartitionProducer] | BrokerError] = []
    async with coordinator.pool.acquire() as conn:
        try:
            info = await get_topic(conn, topic)
        except BrokerError as error:
            found = [error] * len(partitions)
        else:
            for partition in partitions:
                if not 0 <= partition < info.partition_count:
                    found.append(unknown_partition(info, partition))
                else:
                    found.append(await producer_ids.describe_partition_producers(conn, info.topic_id, partition))
    try:
        await confirmed_by_the_standby(coordinator.replication_barrier, f"the producers of topic {topic!r}")
    except DatabaseUnavailable as unconfirmed:
        return [unconfirmed] * len(found)
    return found


async def list_markers(
    coordinator: TransactionCoordinator, topic: str, partition: int, offset: int, limit: int
) -> list[Marker]:
    """The transaction markers of a partition from an offset on, answered once the synchronous
    standby has them (a COMMIT marker a failover takes back is a commit that did not happen), as is
    UNKNOWN_TOPIC_OR_PARTITION (a deletion the standby lacks comes back); DatabaseUnavailable,
    retriable, if it has not within READ_WAIT_MIN_S."""
    async with reads_confirmed_by_the_standby(coordinator.replication_barrier, f"the markers of {topic}-{partition}"):
        async with coordinator.pool.acquire() as conn:
            info = await _partition(conn, topic, partition)
            found = await markers.list_markers(conn, info.topic_id, partition, offset, limit)
    return found
