"""Transaction markers: the COMMIT or ABORT control record a transaction leaves in each of its
partitions, which is what makes its records visible to (or hidden from) read_committed readers.

Writing a marker is idempotent: a partition where the producer has a marker of this epoch and no
open transaction (the marker closed it) gets none, so recovery may re-run a half-finished EndTxn
safely. With transaction version 1 the epoch carries over, so an earlier transaction's marker of the
same epoch may exist: the open transaction (its first offset in producer_states) still gets its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from app.storage.log.fused_writes import WriteStatement
from app.storage.log.locks import LockedPartitions, PartitionLocks
from app.storage.log.partition_log import APPENDS_CHANNEL, BATCH_COLUMNS, CONTROL_ABORT, CONTROL_COMMIT
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


@dataclass(frozen=True, slots=True)
class TransactionEnd:
    """The markers one transaction leaves: `control_type` in each of its (topic_id, partition).
    `consumer_offsets_partitions`: those of __consumer_offsets, whose offsets the caller settles."""

    partitions: list[tuple[int, int]]
    producer_id: int
    producer_epoch: int
    control_type: int
    consumer_offsets_partitions: list[int] = field(default_factory=list)


# The statement that writes markers (plan_markers; fused with the caller's other writes:
# fused_writes.py), for every marker still to write (each row of `m`, in a partition locked by
# locks.lock_partitions, at an offset from its high watermark on; several transactions'
# markers in one partition take consecutive offsets):
# the control batch takes that one offset, the marker row records it, the producer's transaction is
# closed there (advancing the LSO), the partition's high watermark moves past its last marker, and
# long polls wake up (records may have become visible to read_committed).
_WRITE_ALL_QUERIES = f"""m AS (
    SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[], $4::bigint[], $5::bigint[], $6::int[], $7::int[])
        AS m(topic_id, partition, marker_offset, first_offset, producer_id, producer_epoch, control_type)
), marker_head AS (
    UPDATE partitions p SET high_watermark = last.marker_offset + 1
    FROM (SELECT topic_id, partition, max(marker_offset) AS marker_offset FROM m GROUP BY topic_id, partition) last
    WHERE p.topic_id = last.topic_id AND p.partition = last.partition
), control AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT m.topic_id, m.partition, m.marker_offset, m.marker_offset, m.producer_id, m.producer_epoch, -1, true,
        m.control_type, $8, $8, 1, 0, '\\x5b5d'::bytea
    FROM m
), marker AS (
    INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, control_type, marker_offset,
        first_offset, timestamp_ms)
    SELECT m.topic_id, m.partition, m.producer_id, m.producer_epoch, m.control_type, m.marker_offset,
        m.first_offset, $8
    FROM m
), closed AS (
    UPDATE producer_states s SET current_txn_first_offset = NULL
    FROM m WHERE s.topic_id = m.topic_id AND s.partition = m.partition AND s.producer_id = m.producer_id
)"""
_WRITE_ALL_FINAL = f"SELECT pg_notify('{APPENDS_CHANNEL}', m.topic_id::text || ':' || m.partition::text) FROM m"


def locks_for_markers(ends: list[TransactionEnd]) -> PartitionLocks:
    """What plan_markers needs locked: the transactions' partitions, their producers' states there
    (the offset each transaction began at) and the markers they may have left already."""
    keys = [(key, end) for end in ends for key in end.partitions]
    return PartitionLocks(
        frozenset(key for key, _ in keys),
        frozenset((*key, end.producer_id) for key, end in keys),
        frozenset((*key, end.producer_id, end.producer_epoch) for key, end in keys),
    )


def plan_markers(ends: list[TransactionEnd], locked: LockedPartitions, now_ms: int) -> WriteStatement | None:
    """The statement that writes the markers of several transactions (each partition of each,
    unless it has its marker already), after whatever `locked` was advanced past in the same
    PostgreSQL transaction (appends planned before), with their partitions locked
    (`locks_for_markers` or more). None when no marker is to be written. A partition that is gone
    (its topic deleted during the transaction) gets none."""
    heads = locked.heads
    to_write: list[tuple[TransactionEnd, int, int, int, int | None]] = []
    for end in ends:
        for topic_id, partition in end.partitions:
            key = (topic_id, partition)
            offset = heads.get(key)
            if offset is None:
                continue
            state = locked.states.get((*key, end.producer_id))
            first_offset = None if state is None else state.current_txn_first_offset
            if first_offset is None and (*key, end.producer_id, end.producer_epoch) in locked.markers:
                continue  # this transaction's marker, written already (or no record of it here)
            heads[key] = offset + 1
            to_write.append((end, topic_id, partition, offset, first_offset))
    if not to_write:
        return None
    return WriteStatement(
        _WRITE_ALL_QUERIES,
        _WRITE_ALL_FINAL,
        (
            [topic_id for _, topic_id, _, _, _ in to_write],
            [partition for _, _, partition, _, _ in to_write],
            [offset for _, _, _, offset, _ in to_write],
            [first for _, _, _, _, first in to_write],
            [end.producer_id for end, *_ in to_write],
            [end.producer_epoch for end, *_ in to_write],
            [end.control_type for end, *_ in to_write],
            now_ms,
        ),
    )


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
