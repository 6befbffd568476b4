"""Transaction markers: the COMMIT or ABORT control record a transaction leaves in each of its
partitions, which is what makes its records visible to (or hidden from) read_committed readers.

Writing a marker is idempotent per (partition, producer id, epoch): the txn_markers row is the key,
so recovery may re-run a half-finished EndTxn safely.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.partition_log import APPENDS_CHANNEL, BATCH_COLUMNS, CONTROL_ABORT, CONTROL_COMMIT
from app.storage.rows import all_from_rows

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


# write_markers' first statement: locks every partition of the transaction, in lock_order (the
# LockRows node sits above the Sort, so rows are locked in the ORDER BY's order, as one statement
# per partition in that order would), with each one's marker if it already has one and the
# producer's open-transaction offset. The high watermark comes from the locked row (re-read after
# any wait); the marker and the producer's state cannot change meanwhile, since only requests
# holding this transactional id's row write them for this producer id and epoch.
_LOCK_ALL_SQL = """
SELECT p.topic_id, p.partition, p.high_watermark,
       (SELECT m.marker_offset FROM txn_markers m WHERE m.topic_id = p.topic_id AND m.partition = p.partition
          AND m.producer_id = $3 AND m.producer_epoch = $4) AS existing_marker,
       (SELECT s.current_txn_first_offset FROM producer_states s WHERE s.topic_id = p.topic_id
          AND s.partition = p.partition AND s.producer_id = $3) AS first_offset
FROM partitions p JOIN unnest($1::int[], $2::int[]) AS wanted(topic_id, partition)
  ON p.topic_id = wanted.topic_id AND p.partition = wanted.partition
ORDER BY p.topic_id, p.partition
FOR UPDATE OF p
"""

# write_markers' second statement, for every partition still without its marker (each row of `m` is
# a partition locked by _LOCK_ALL_SQL, with its high watermark as the marker's offset): the control
# batch takes that one offset, the marker row records it, the producer's transaction is closed there
# (advancing the LSO), and long polls wake up (records may have become visible to read_committed).
_WRITE_ALL_SQL = f"""
WITH m AS (
    SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[], $4::bigint[])
        AS m(topic_id, partition, marker_offset, first_offset)
), head AS (
    UPDATE partitions p SET high_watermark = m.marker_offset + 1
    FROM m WHERE p.topic_id = m.topic_id AND p.partition = m.partition
), control AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT m.topic_id, m.partition, m.marker_offset, m.marker_offset, $5, $6, -1, true, $7, $8, $8, 1, 0,
        '\\x5b5d'::bytea
    FROM m
), marker AS (
    INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, control_type, marker_offset,
        first_offset, timestamp_ms)
    SELECT m.topic_id, m.partition, $5, $6, $7, m.marker_offset, m.first_offset, $8 FROM m
), closed AS (
    UPDATE producer_states s SET current_txn_first_offset = NULL
    FROM m WHERE s.topic_id = m.topic_id AND s.partition = m.partition AND s.producer_id = $5
)
SELECT pg_notify('{APPENDS_CHANNEL}', m.topic_id::text || ':' || m.partition::text) FROM m
"""


async def write_markers(
    conn: asyncpg.Connection,
    partitions: list[tuple[int, int]],
    producer_id: int,
    producer_epoch: int,
    control_type: int,
    now_ms: int,
) -> dict[tuple[int, int], int]:
    """Writes the transaction's marker into each of its partitions (topic_id, partition) that has none
    yet, in two statements whatever their number: the first locks them all in lock_order. Returns
    each partition's marker offset (written now or found before); a partition that is gone (its
    topic deleted during the transaction) is left out. The caller holds the PostgreSQL transaction."""
    if not partitions:
        return {}
    topic_ids, numbers = zip(*partitions)
    rows = await conn.fetch(_LOCK_ALL_SQL, list(topic_ids), list(numbers), producer_id, producer_epoch)
    offsets: dict[tuple[int, int], int] = {}
    to_write: list[asyncpg.Record] = []
    for row in rows:
        key = (row["topic_id"], row["partition"])
        if row["existing_marker"] is not None:
            offsets[key] = row["existing_marker"]
        else:
            offsets[key] = row["high_watermark"]
            to_write.append(row)
    if to_write:
        await conn.execute(
            _WRITE_ALL_SQL,
            [row["topic_id"] for row in to_write],
            [row["partition"] for row in to_write],
            [row["high_watermark"] for row in to_write],
            [row["first_offset"] for row in to_write],
            producer_id,
            producer_epoch,
            control_type,
            now_ms,
        )
    return offsets


async def list_markers(
    conn: asyncpg.Connection, topic_id: int, partition: int, from_offset: int, limit: int
) -> list[Marker]:
    rows = await conn.fetch(
        "SELECT marker_offset AS offset, producer_id, producer_epoch, control_type, timestamp_ms, first_offset "
        "FROM txn_markers WHERE topic_id = $1 AND partition = $2 AND marker_offset >= $3 "
        "ORDER BY marker_offset LIMIT $4",
        topic_id,
        partition,
        from_offset,
        limit,
    )
    return all_from_rows(Marker, rows)
