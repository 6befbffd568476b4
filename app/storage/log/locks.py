"""The partitions' row locks: a PostgreSQL transaction that writes to several partitions (appends,
markers) locks their rows in one statement, in lock_order, and reads under the locks what its
writes are planned from (each partition's head, producers' states, transactions' markers).

Invariant: everyone who locks several partitions locks them in lock_order, so no two PostgreSQL
transactions can deadlock on partition rows.

The lock is taken also when a batch turns out to be a duplicate, answered from the producer's state
with nothing written: locking the rows gives the PostgreSQL transaction an id and a WAL record, so
its COMMIT waits for the synchronous standby past the commit that wrote the original, which may not
have been confirmed (database.py). Skipping the lock for duplicates would acknowledge them before
the standby has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.log import sequences

# Appends of a PostgreSQL transaction (one produce request, or a write batch of requests committed
# together, app/coordinator/batched_writes.py) lock their partitions in one statement, in lock_order (the LockRows
# node sits above the Sort, so rows are locked in the ORDER BY's order). A row that was locked by
# someone else is re-read once its lock is ours, so the high watermarks returned are current (rows
# with a NULL producer_id).
#
# The same statement reads the states of transactional producers ($3-$5: rows with a producer_id
# and no marker_offset) and the markers transactions already left ($6-$9: rows with a
# marker_offset), though its snapshot was taken before any wait for a partition's lock: every write
# of a transactional producer's state or markers (its appends, its markers, its epoch bump) is made
# by a request holding its transactional id's row, and the caller has held that row since an
# earlier statement (lock_partitions' contract), so every such write committed before this
# statement began. The wait for a partition may only be for other producers' appends.
#
# Of a transaction's markers only whether one exists is asked (markers.plan_markers), so at most one
# row per marker asked for: the producer's latest marker in the partition, answered when it is of
# the epoch asked for. That is the answer to "is there a marker of this epoch": a producer id's
# epochs only grow (producer_ids.next_epoch; an exhausted one gets a new id, never reused), its
# markers in a partition are written one after the other under its transactional id's row, and no
# marker of a later epoch is written before a transaction's own (the next transaction begins only
# once this one has ended; a Prepared one kept for a new instance, KIP-939, is ended before that
# instance begins another), so the markers' epochs never fall with their offsets and none is above
# the one asked for: a marker of that epoch exists exactly when the latest is one. The index on
# (topic_id, partition, producer_id, marker_offset), read backwards, gives the latest as its first
# row. Filtering the epoch inside the look-up instead made it read back through
# every earlier marker of the producer: with transaction version 2 (the epoch bumped at each end)
# the epoch asked for has none yet, and with version 1 every earlier transaction of the epoch left
# one; either way each EndTxn's work grew with the producer's number of transactions.
_LOCK_HEADS_SQL = """
WITH locked AS MATERIALIZED (
    SELECT p.topic_id, p.partition, p.high_watermark, p.log_start_offset
    FROM partitions p JOIN unnest($1::int[], $2::int[]) AS wanted(topic_id, partition)
      ON p.topic_id = wanted.topic_id AND p.partition = wanted.partition
    ORDER BY p.topic_id, p.partition
    FOR UPDATE OF p
)
SELECT topic_id, partition, high_watermark, log_start_offset, NULL AS producer_id, NULL AS producer_epoch,
       NULL AS last_sequence, NULL AS recent_batches, NULL AS current_txn_first_offset, NULL::bigint AS marker_offset
FROM locked
UNION ALL
SELECT s.topic_id, s.partition, NULL, NULL, s.producer_id, s.producer_epoch, s.last_sequence, s.recent_batches,
       s.current_txn_first_offset, NULL
FROM producer_states s JOIN unnest($3::int[], $4::int[], $5::bigint[]) AS wanted(topic_id, partition, producer_id)
  ON s.topic_id = wanted.topic_id AND s.partition = wanted.partition AND s.producer_id = wanted.producer_id
UNION ALL
SELECT m.topic_id, m.partition, NULL, NULL, m.producer_id, m.producer_epoch, NULL, NULL, NULL, m.marker_offset
FROM unnest($6::int[], $7::int[], $8::bigint[], $9::int[]) AS wanted(topic_id, partition, producer_id, producer_epoch)
CROSS JOIN LATERAL (
    SELECT t.topic_id, t.partition, t.producer_id, t.producer_epoch, t.marker_offset
    FROM txn_markers t
    WHERE t.topic_id = wanted.topic_id AND t.partition = wanted.partition AND t.producer_id = wanted.producer_id
    ORDER BY t.marker_offset DESC
    LIMIT 1
) m
WHERE m.producer_epoch = wanted.producer_epoch
"""


def producer_entry_from_row(row: asyncpg.Record) -> sequences.ProducerEntry:
    return sequences.ProducerEntry(
        row["producer_epoch"],
        row["last_sequence"],
        tuple(sequences.RecentBatch(*batch) for batch in row["recent_batches"]),
        row["current_txn_first_offset"],
    )


@dataclass(slots=True)
class LockedPartitions:
    """What lock_partitions read under the locks: each partition's high watermark (`heads`) and log
    start offset (`log_starts`, which Produce answers: DeleteRecords and the log cleaner move it under
    the same row lock, so it holds until commit), the state of each producer asked for (`states`, by
    (topic_id, partition, producer_id)) and, for each marker asked for that exists, the offset of the
    latest (`markers`, by (topic_id, partition, producer_id, producer_epoch)). Planning advances
    `heads` and `states` past what it plans to write, so that what is planned next in the same
    PostgreSQL transaction follows it."""

    heads: dict[tuple[int, int], int]
    log_starts: dict[tuple[int, int], int]
    states: dict[tuple[int, int, int], sequences.ProducerEntry]
    markers: dict[tuple[int, int, int, int], int]


@dataclass(frozen=True, slots=True)
class PartitionLocks:
    """What a PostgreSQL transaction asks lock_partitions for: partitions (topic_id, partition),
    transactional producers' states there (topic_id, partition, producer_id) and transactions'
    markers there (topic_id, partition, producer_id, producer_epoch)."""

    partitions: frozenset[tuple[int, int]] = frozenset()
    producers: frozenset[tuple[int, int, int]] = frozenset()
    markers: frozenset[tuple[int, int, int, int]] = frozenset()

    def __or__(self, other: PartitionLocks) -> PartitionLocks:
        return PartitionLocks(
            self.partitions | other.partitions, self.producers | other.producers, self.markers | other.markers
        )


async def lock_partitions(conn: asyncpg.Connection, locks: PartitionLocks) -> LockedPartitions:
    """Locks these partitions' rows until the caller's PostgreSQL transaction ends, in lock_order,
    in one statement, reading what `locks` asks for. The producers and markers asked for must be
    those of transactional ids whose rows the caller has held since an earlier statement (see
    _LOCK_HEADS_SQL). A partition that is gone (its topic deleted) has no head. No statement when
    no partition is asked for."""
    if not locks.partitions:
        return LockedPartitions({}, {}, {}, {})
    wanted = sorted(locks.partitions, key=_lock_key)
    producers, markers = sorted(locks.producers), sorted(locks.markers)
    rows = await conn.fetch(
        _LOCK_HEADS_SQL,
        [t for t, _ in wanted],
        [p for _, p in wanted],
        *(list(column) for column in zip(*producers)) if producers else ([], [], []),
        *(list(column) for column in zip(*markers)) if markers else ([], [], [], []),
    )
    locked = LockedPartitions({}, {}, {}, {})
    for row in rows:
        if row["producer_id"] is None:
            locked.heads[(row["topic_id"], row["partition"])] = row["high_watermark"]
            locked.log_starts[(row["topic_id"], row["partition"])] = row["log_start_offset"]
        elif row["marker_offset"] is None:
            locked.states[(row["topic_id"], row["partition"], row["producer_id"])] = producer_entry_from_row(row)
        else:
            key = (row["topic_id"], row["partition"], row["producer_id"], row["producer_epoch"])
            locked.markers[key] = row["marker_offset"]
    return locked


def _lock_key(key: tuple[int, int]) -> tuple[int, int]:
    return lock_order(*key)


def lock_order(topic_id: int, partition: int) -> tuple[int, int]:
    """Everyone who locks several partitions (produce, markers) locks them in this order, so no two
    PostgreSQL transactions can deadlock on partition rows."""
    return topic_id, partition
