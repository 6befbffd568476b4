"""Transaction markers: the COMMIT or ABORT control record a transaction leaves in each of its
partitions, which is what makes its records visible to (or hidden from) read_committed readers.

Writing a marker is idempotent per (partition, producer id, epoch): the txn_markers row is the key,
so recovery may re-run a half-finished EndTxn safely.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from app.storage.fused_writes import WriteStatement, execute_fused
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


@dataclass(frozen=True, slots=True)
class TransactionEnd:
    """The markers one transaction leaves: `control_type` in each of its (topic_id, partition).
    `consumer_offsets_partitions`: those of __consumer_offsets, whose offsets the caller settles."""

    partitions: list[tuple[int, int]]
    producer_id: int
    producer_epoch: int
    control_type: int
    consumer_offsets_partitions: list[int] = field(default_factory=list)


# write_markers_of's first statement: locks every partition of the transactions, in lock_order (the
# LockRows node sits above the Sort, so rows are locked in the ORDER BY's order, as one statement
# per partition in that order would), with each transaction's marker there if it already has one
# and its producer's open-transaction offset. The high watermark comes from the locked row (re-read
# after any wait); the markers and the producers' states cannot change meanwhile, since only
# requests holding a transactional id's row write them for its producer id and epoch.
_LOCK_ALL_SQL = """
SELECT w.ord, p.topic_id, p.partition, p.high_watermark,
       (SELECT m.marker_offset FROM txn_markers m WHERE m.topic_id = p.topic_id AND m.partition = p.partition
          AND m.producer_id = w.producer_id AND m.producer_epoch = w.producer_epoch) AS existing_marker,
       (SELECT s.current_txn_first_offset FROM producer_states s WHERE s.topic_id = p.topic_id
          AND s.partition = p.partition AND s.producer_id = w.producer_id) AS first_offset
FROM partitions p
JOIN unnest($1::int[], $2::int[], $3::bigint[], $4::int[]) WITH ORDINALITY
    AS w(topic_id, partition, producer_id, producer_epoch, ord)
  ON p.topic_id = w.topic_id AND p.partition = w.partition
ORDER BY p.topic_id, p.partition, w.ord
FOR UPDATE OF p
"""

# write_markers_of's second statement (fused with the caller's `then`: fused_writes.py), for every
# marker still to write (each row of `m`, in a partition locked by _LOCK_ALL_SQL, at an offset from
# its high watermark on; several transactions' markers in one partition take consecutive offsets):
# the control batch takes that one offset, the marker row records it, the producer's transaction is
# closed there (advancing the LSO), the partition's high watermark moves past its last marker, and
# long polls wake up (records may have become visible to read_committed).
_WRITE_ALL_QUERIES = f"""m AS (
    SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[], $4::bigint[], $5::bigint[], $6::int[], $7::int[])
        AS m(topic_id, partition, marker_offset, first_offset, producer_id, producer_epoch, control_type)
), head AS (
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


async def write_markers_of(
    conn: asyncpg.Connection, ends: list[TransactionEnd], now_ms: int, then: WriteStatement | None = None
) -> None:
    """Writes the markers of several transactions (each partition of each, unless it has its marker
    already), in two statements whatever their number: the first locks every partition in
    lock_order. A partition that is gone (its topic deleted during the transaction) gets none. The
    caller holds the PostgreSQL transaction. `then`: a statement of the caller's to run last, fused
    with the second statement (or alone when no marker is to be written)."""
    wanted = [(end_index, key) for end_index, end in enumerate(ends) for key in end.partitions]
    rows = (
        await conn.fetch(
            _LOCK_ALL_SQL,
            [key[0] for _, key in wanted],
            [key[1] for _, key in wanted],
            [ends[end_index].producer_id for end_index, _ in wanted],
            [ends[end_index].producer_epoch for end_index, _ in wanted],
        )
        if wanted
        else []
    )
    heads: dict[tuple[int, int], int] = {}
    to_write: list[tuple[TransactionEnd, int, int, int, int | None]] = []
    for row in rows:
        end_index = wanted[row["ord"] - 1][0]
        key = (row["topic_id"], row["partition"])
        if row["existing_marker"] is not None:
            continue
        offset = heads.get(key, row["high_watermark"])
        heads[key] = offset + 1
        to_write.append((ends[end_index], *key, offset, row["first_offset"]))
    statement = None
    if to_write:
        statement = WriteStatement(
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
    await execute_fused(conn, statement, then)


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
