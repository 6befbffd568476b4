"""Whole batches of a partition, as stored, for a door that returns batches rather than records
(the Kafka listener's Fetch): data batches, control batches (markers) and, for read_committed,
whether each transactional batch was aborted, so that the reader can skip it as Kafka clients do.
A data batch stored as a RecordBatch (record_codec) is returned as stored, for the door to send as
it is; one stored as JSON is returned as records.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.log import record_codec
from app.storage.log.partition_log import ABORTED_BATCH_SQL, BATCH_BYTES_SQL
from app.storage.log.topics import TopicInfo


@dataclass(frozen=True, slots=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    control_type: int | None
    first_timestamp_ms: int
    aborted: bool
    # Its bytes as a Fetch counts them toward min_bytes and max_bytes (partition_log.BATCH_BYTES_SQL):
    # a marker's are those of the control batch it is sent as, as Kafka counts any batch of its log.
    size_bytes: int
    # A data batch stored as JSON: record i at base_offset + i; None where compaction removed one.
    records: list[record_codec.ByteRecord | None] | None
    # A data batch stored as a RecordBatch: its stored bytes (base offset 0, record_codec).
    record_batch: bytes | None

    @property
    def record_count(self) -> int:
        """Its offsets, compaction's holes included (a marker's one)."""
        return self.last_offset - self.base_offset + 1


def _contents(payload: bytes) -> tuple[list[record_codec.ByteRecord | None] | None, bytes | None]:
    """(records, record_batch) of a batch's payload: one of them is None."""
    if record_codec.is_record_batch(payload):
        return None, payload
    return [
        None if stored is None else record_codec.byte_record(stored) for stored in record_codec.decode_payload(payload)
    ], None


# The batches from $3 on, below $4 (the reader's upper bound, from the partition state it read in
# an earlier statement), in log order, at most $5 of them, while their sizes add up to at most $7,
# and the first always (a reader must make progress whatever the sizes, as Kafka's KIP-74 has it,
# also when it is a marker). Sizes as Kafka counts batches: a marker's control batch too.
# The primary key's order feeds the window functions, which stream, so the LIMIT stops the scan;
# only the rows kept have their payloads read (out of line, TOAST). One statement, one snapshot:
# below the upper bound batches are never appended to, and a batch's abort marker is never removed
# before the batch itself (log_cleaner.py), so `aborted` is right for every row returned; what the
# cleaner removes between a caller's statements is simply not returned.
# With $6 (read_committed), each transactional batch's marker decides whether it is aborted
# (partition_log.ABORTED_BATCH_SQL).
_BATCHES_SQL = f"""
SELECT b.base_offset, b.last_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.is_transactional,
       b.control_type, b.first_timestamp_ms, {BATCH_BYTES_SQL} AS size_bytes, b.records,
       $6::bool AND {ABORTED_BATCH_SQL} AS aborted
FROM (
    SELECT *, sum({BATCH_BYTES_SQL}) OVER (ORDER BY last_offset) AS size_through,
           row_number() OVER (ORDER BY last_offset) AS position
    FROM record_batches r
    WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND base_offset < $4
    ORDER BY last_offset
    LIMIT $5
) AS b
WHERE b.position = 1 OR b.size_through <= $7
ORDER BY b.last_offset
"""


async def read_batches(
    conn: asyncpg.Connection,
    topic: TopicInfo,
    partition: int,
    offset: int,
    upper: int,
    max_batches: int,
    max_bytes: int,
    read_committed: bool,
) -> list[StoredBatch]:
    """The batches holding offsets from `offset` up to `upper` (exclusive), whole: up to
    max_batches of them, while their sizes (StoredBatch.size_bytes) fit in max_bytes, and at least one."""
    rows = await conn.fetch(
        _BATCHES_SQL, topic.topic_id, partition, offset, upper, max_batches, read_committed, max(max_bytes, 1)
    )
    return [
        StoredBatch(
            row["base_offset"],
            row["last_offset"],
            row["producer_id"],
            row["producer_epoch"],
            row["base_sequence"],
            row["is_transactional"],
            row["control_type"],
            row["first_timestamp_ms"],
            row["aborted"],
            row["size_bytes"],
            *_contents(row["records"]),
        )
        for row in rows
    ]
