"""Transaction markers: the COMMIT or ABORT control record a transaction leaves in each of its
partitions, which is what makes its records visible to (or hidden from) read_committed readers.

Writing a marker is idempotent per (partition, producer id, epoch): the txn_markers row is the key,
so recovery may re-run a half-finished EndTxn safely.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.partition_log import APPENDS_CHANNEL, CONTROL_ABORT, CONTROL_COMMIT

CONTROL_TYPE_NAMES = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}


@dataclass(frozen=True, slots=True)
class Marker:
    offset: int
    producer_id: int
    producer_epoch: int
    control_type: int
    timestamp_ms: int
    first_offset: int | None

    @property
    def type_name(self) -> str:
        return CONTROL_TYPE_NAMES[self.control_type]


# Locks the partition, and finds the marker if this transaction already has one there and the
# producer's open-transaction offset (the marker closes it).
_LOCK_SQL = """
SELECT p.high_watermark,
       (SELECT m.marker_offset FROM txn_markers m WHERE m.topic_id = p.topic_id AND m.partition = p.partition
          AND m.producer_id = $3 AND m.producer_epoch = $4) AS existing_marker,
       (SELECT s.current_txn_first_offset FROM producer_states s WHERE s.topic_id = p.topic_id
          AND s.partition = p.partition AND s.producer_id = $3) AS first_offset
FROM partitions p WHERE p.topic_id = $1 AND p.partition = $2
FOR UPDATE OF p
"""

# With the partition locked at high watermark $5: the control batch takes that one offset, the
# marker row records it, the producer's transaction is closed there (advancing the LSO), and long
# polls wake up (records may have become visible to read_committed).
_WRITE_SQL = f"""
WITH head AS (
    UPDATE partitions SET high_watermark = $5::bigint + 1 WHERE topic_id = $1 AND partition = $2
), control AS (
    INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id, producer_epoch,
        base_sequence, is_transactional, control_type, first_timestamp_ms, max_timestamp_ms, record_count,
        size_bytes, records)
    VALUES ($1, $2, $5, $5, $3, $4, -1, true, $6, $7, $7, 1, 0, '\\x5b5d')
), marker AS (
    INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, control_type, marker_offset,
        first_offset, timestamp_ms)
    VALUES ($1, $2, $3, $4, $6, $5, $8, $7)
), closed AS (
    UPDATE producer_states SET current_txn_first_offset = NULL
    WHERE topic_id = $1 AND partition = $2 AND producer_id = $3
)
SELECT pg_notify('{APPENDS_CHANNEL}', $1::text || ':' || $2::text)
"""


async def write_marker(conn: asyncpg.Connection, topic_id: int, partition: int, producer_id: int,
                       producer_epoch: int, control_type: int, now_ms: int) -> int | None:
    """Writes the marker unless it exists; returns its offset, or None if the partition is gone
    (its topic was deleted during the transaction). The caller holds the PostgreSQL transaction and
    writes a transaction's markers in partition_log.lock_order."""
    row = await conn.fetchrow(_LOCK_SQL, topic_id, partition, producer_id, producer_epoch)
    if row is None:
        return None
    if row["existing_marker"] is not None:
        return row["existing_marker"]
    offset = row["high_watermark"]
    await conn.execute(_WRITE_SQL, topic_id, partition, producer_id, producer_epoch, offset, control_type,
                       now_ms, row["first_offset"])
    return offset


async def list_markers(conn: asyncpg.Connection, topic_id: int, partition: int, from_offset: int,
                       limit: int) -> list[Marker]:
    rows = await conn.fetch(
        "SELECT marker_offset, producer_id, producer_epoch, control_type, timestamp_ms, first_offset "
        "FROM txn_markers WHERE topic_id = $1 AND partition = $2 AND marker_offset >= $3 "
        "ORDER BY marker_offset LIMIT $4", topic_id, partition, from_offset, limit)
    return [Marker(*row) for row in rows]
