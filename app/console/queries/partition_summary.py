"""Watermarks of topics and partitions for the console, a page at a time: high watermark, last
stable offset, and the offsets held back between them by open transactions.

Read-only. Every query is bounded by its page (keyset on the topic name or partition number), so
its cost does not grow with the number of topics or partitions. The LSO comes from the partial
index `producer_states_open_transactions` (only producers with an open transaction are in it),
exactly as `partition_log.partition_state` derives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from app.storage.rows import all_from_rows


@dataclass(frozen=True, slots=True)
class TopicSummary:
    topic_id: int
    name: str
    partition_count: int
    is_internal: bool
    config: dict[str, Any]
    high_watermark: int  # the sum over partitions: offsets ever written (records and markers)
    retained: int  # the sum of high_watermark - log_start_offset
    held_back: int  # the sum of high_watermark - last_stable_offset
    pinned_partitions: int  # partitions whose LSO an open transaction holds below the HW
    producers: int  # distinct producer ids with state on the topic


@dataclass(frozen=True, slots=True)
class Totals:
    """Over every topic but the internal ones."""

    topics: int
    partitions: int
    high_watermark: int  # summed over their partitions
    held_back: int
    pinned_partitions: int
    groups: int


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    open_transactions: int  # producers with an open transaction here
    producers: int
    last_append_ms: int | None  # the newest timestamp of the last batch, None for an empty log
    last_cleanup_ms: int | None = None  # when the log cleaner last removed or rewrote something here

    @property
    def held_back(self) -> int:
        return self.high_watermark - self.last_stable_offset


# The page's topics first (keyset on the unique name), then their partitions and open transactions:
# the aggregate touches only the rows of the topics shown.
_TOPICS_SQL = """
WITH page AS (
    SELECT topic_id, name, partition_count, is_internal, config FROM topics {where}
), open_first AS (
    SELECT s.topic_id, s.partition, min(s.current_txn_first_offset) AS first_open
    FROM producer_states s JOIN page USING (topic_id)
    WHERE s.current_txn_first_offset IS NOT NULL
    GROUP BY s.topic_id, s.partition
)
SELECT page.topic_id, page.name, page.partition_count, page.is_internal, page.config,
       coalesce(sum(p.high_watermark), 0)::bigint AS high_watermark,
       coalesce(sum(p.high_watermark - p.log_start_offset), 0)::bigint AS retained,
       coalesce(sum(p.high_watermark - least(coalesce(o.first_open, p.high_watermark), p.high_watermark)), 0)::bigint
           AS held_back,
       count(o.first_open) AS pinned_partitions,
       (SELECT count(DISTINCT s.producer_id) FROM producer_states s WHERE s.topic_id = page.topic_id) AS producers
FROM page
JOIN partitions p ON p.topic_id = page.topic_id
LEFT JOIN open_first o ON o.topic_id = p.topic_id AND o.partition = p.partition
GROUP BY page.topic_id, page.name, page.partition_count, page.is_internal, page.config
ORDER BY page.name
"""


_TOPIC_PAGE_SQL = _TOPICS_SQL.format(
    where="WHERE ($1::text IS NULL OR name > $1) AND ($3 OR NOT is_internal) ORDER BY name LIMIT $2"
)
_ONE_TOPIC_SQL = _TOPICS_SQL.format(where="WHERE topic_id = $1")


async def topic_page(
    conn: asyncpg.Connection, after: str | None, limit: int, include_internal: bool
) -> list[TopicSummary]:
    """Topics ordered by name, after `after` (keyset), with their partitions' watermarks summed."""
    rows = await conn.fetch(_TOPIC_PAGE_SQL, after, limit, include_internal)
    return all_from_rows(TopicSummary, rows)


async def topic_summary(conn: asyncpg.Connection, topic_id: int) -> TopicSummary:
    return TopicSummary(*await conn.fetchrow(_ONE_TOPIC_SQL, topic_id))


# Topics other than the internal ones. The partitions with an open transaction come from the partial
# index of open producer states.
_TOTALS_SQL = """
WITH open_first AS (
    SELECT s.topic_id, s.partition, min(s.current_txn_first_offset) AS first_open FROM producer_states s
    JOIN topics t ON t.topic_id = s.topic_id AND NOT t.is_internal
    WHERE s.current_txn_first_offset IS NOT NULL GROUP BY s.topic_id, s.partition
)
SELECT (SELECT count(*) FROM topics WHERE NOT is_internal) AS topics,
       (SELECT coalesce(sum(partition_count), 0) FROM topics WHERE NOT is_internal)::bigint AS partitions,
       (SELECT coalesce(sum(p.high_watermark), 0) FROM partitions p JOIN topics t ON t.topic_id = p.topic_id
        WHERE NOT t.is_internal)::bigint AS high_watermark,
       (SELECT coalesce(sum(greatest(p.high_watermark - o.first_open, 0)), 0) FROM open_first o
        JOIN partitions p ON p.topic_id = o.topic_id AND p.partition = o.partition)::bigint AS held_back,
       (SELECT count(*) FROM open_first) AS pinned_partitions,
       (SELECT count(*) FROM consumer_groups) AS groups
"""


async def totals(conn: asyncpg.Connection) -> Totals:
    return Totals(*await conn.fetchrow(_TOTALS_SQL))


# One page of partitions (keyset on the partition number, a primary-key range); per partition, index
# probes for its open transactions, its producers and its last batch.
_PARTITION_PAGE_SQL = """
SELECT p.partition, p.log_start_offset, p.high_watermark,
       least(coalesce(o.first_open, p.high_watermark), p.high_watermark) AS last_stable_offset,
       coalesce(o.open_transactions, 0) AS open_transactions,
       (SELECT count(*) FROM producer_states s WHERE s.topic_id = p.topic_id AND s.partition = p.partition)
           AS producers,
       (SELECT b.max_timestamp_ms FROM record_batches b WHERE b.topic_id = p.topic_id AND b.partition = p.partition
        ORDER BY b.last_offset DESC LIMIT 1) AS last_append_ms,
       (SELECT c.last_cleanup_ms FROM partition_cleanups c WHERE c.topic_id = p.topic_id AND c.partition = p.partition)
           AS last_cleanup_ms
FROM partitions p
LEFT JOIN LATERAL (
    SELECT min(s.current_txn_first_offset) AS first_open, count(*) AS open_transactions FROM producer_states s
    WHERE s.topic_id = p.topic_id AND s.partition = p.partition AND s.current_txn_first_offset IS NOT NULL
) o ON true
WHERE p.topic_id = $1 AND p.partition > $2
ORDER BY p.partition LIMIT $3
"""


async def partition_page(conn: asyncpg.Connection, topic_id: int, after: int, limit: int) -> list[PartitionSummary]:
    """Partitions numbered above `after` (keyset; -1 for the first page)."""
    rows = await conn.fetch(_PARTITION_PAGE_SQL, topic_id, after, limit)
    return all_from_rows(PartitionSummary, rows)
