"""A partition of many transactions, far more markers than lag counts (group_offsets.MARKERS_COUNTED),
written with SQL in the form the storage modules write them (producing them one transaction at a
time would take minutes): one record then its COMMIT marker, MARKERS times, so a marker is at every
odd offset and the high watermark is HIGH_WATERMARK. For the tests of lag's bounded marker count,
HTTP's describe and the console's group pages alike; and the markers a statement reads, by
PostgreSQL's EXPLAIN ANALYZE (rows, not time)."""

from __future__ import annotations

import asyncpg

from app.storage.groups.group_offsets import MARKERS_COUNTED

MARKERS = 5 * MARKERS_COUNTED
HIGH_WATERMARK = 2 * MARKERS  # a marker at every odd offset


async def write_many_transactions(database_url: str, topic: str) -> None:
    """Partition 0 of `topic` (which exists) gets MARKERS markers and the high watermark HIGH_WATERMARK."""
    conn = await asyncpg.connect(database_url)
    try:
        topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = $1", topic)
        await conn.execute(
            "INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, control_type, marker_offset, "
            "first_offset, timestamp_ms) SELECT $1, 0, 5000, 0, 1, 2 * g + 1, 2 * g, 1700000000000 "
            "FROM generate_series(0, $2 - 1) g",
            topic_id,
            MARKERS,
        )
        await conn.execute(
            "UPDATE partitions SET high_watermark = $2 WHERE topic_id = $1 AND partition = 0", topic_id, HIGH_WATERMARK
        )
    finally:
        await conn.close()


def marker_rows_read(node: dict) -> int:
    """The rows an EXPLAIN (ANALYZE, FORMAT JSON) plan's scans of txn_markers read: returned, and
    read but filtered out."""
    read = 0
    if node.get("Relation Name") == "txn_markers":
        loops = node.get("Actual Loops", 1)
        read += int((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops)
    return read + sum(marker_rows_read(child) for child in node.get("Plans", []))
