"""Committed consumer offsets, and transactional offsets pending until their marker.

Every commit is also appended to the group's partition of `__consumer_offsets` (the record of what
was committed, as in Kafka). What OffsetFetch sees is `group_offsets`: a plain commit writes it at
once; a transactional one (TxnOffsetCommit) waits in `pending_txn_offsets` until the transaction's
marker lands in that `__consumer_offsets` partition, which `settle` applies in the marker's
PostgreSQL transaction: COMMIT makes the offsets visible, ABORT discards them.

As in Kafka, the commit appended LAST to `__consumer_offsets` wins: each offset remembers the log
offset of the record that committed it (`record_offset`), and a transactional commit settling at its
marker replaces only an offset committed by an earlier record (a plain commit made while it was
pending stays). A transactional commit's records belong to its transaction (producer id and epoch,
is_transactional), so a read_committed reader of `__consumer_offsets` never sees an aborted one.

Each offset keeps the leader epoch its commit carried (NO_LEADER_EPOCH: none), as Kafka's
OffsetCommitValue does: it travels with the offset, pending and settled, and goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import asyncpg
import orjson

from app.storage.groups import offset_metadata
from app.storage.log import record_codec
from app.storage.log.append import BatchAppend, append_batch_or_raise, append_for_coordinator
from app.storage.log.locks import PartitionLocks, lock_partitions
from app.storage.log.topics import TopicInfo, hold_topics
from app.storage.rows import all_from_rows
from txbroker.wire import NO_LEADER_EPOCH, NO_OFFSET


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    topic: str
    partition: int
    offset: int
    metadata: str | None
    leader_epoch: int


def _record_key(group_id: str, topic: str, partition: int) -> str:
    """The key of a group's offset for a partition in `__consumer_offsets` (what compaction keeps the last of)."""
    return orjson.dumps([group_id, topic, partition]).decode()


def _commit_batch(group_id: str, entries: list[OffsetEntry], now_ms: int, transaction: dict | None):
    records = [
        record_codec.TextRecord(
            _record_key(group_id, e.topic, e.partition),
            orjson.dumps(
                {
                    "offset": e.offset,
                    "leader_epoch": e.leader_epoch,
                    "metadata": e.metadata,
                    "commit_timestamp_ms": now_ms,
                    "transaction": transaction,
                }
            ).decode(),
        )
        for e in entries
    ]
    return record_codec.encode_batch(records, "utf8", now_ms, "offset commit")


async def commit(
    conn: asyncpg.Connection,
    offsets_topic: TopicInfo,
    offsets_partition: int,
    group_id: str,
    entries: list[OffsetEntry],
    now_ms: int,
) -> None:
    """A plain OffsetCommit: visible at once, and appended after every record before it, so it
    replaces whatever was committed. The caller holds the PostgreSQL transaction."""
    if not entries:
        return
    appended = await append_batch_or_raise(
        conn, BatchAppend(offsets_topic, offsets_partition, _commit_batch(group_id, entries, now_ms, None))
    )
    await conn.executemany(
        "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms, "
        "record_offset, leader_epoch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
        "ON CONFLICT (group_id, topic, partition) DO UPDATE SET "
        "committed_offset = EXCLUDED.committed_offset, metadata = EXCLUDED.metadata, "
        "commit_timestamp_ms = EXCLUDED.commit_timestamp_ms, record_offset = EXCLUDED.record_offset, "
        "leader_epoch = EXCLUDED.leader_epoch",
        [
            (
                group_id,
                e.topic,
                e.partition,
                e.offset,
                offset_metadata.stored(e.metadata),
                now_ms,
                appended.base_offset + index,
                e.leader_epoch,
            )
            for index, e in enumerate(entries)
        ],
    )


async def committed_under_lock(
    conn: asyncpg.Connection,
    offsets_topic: TopicInfo,
    offsets_partition: int,
    group_id: str,
    keys: list[tuple[str, int]],
) -> dict[tuple[str, int], OffsetEntry]:
    """The group's committed offsets of these (topic, partition)s, by key (none: not there), as
    they stay until the caller's PostgreSQL transaction ends. It locks the group's
    `__consumer_offsets` partition first: every writer of the group's offsets holds that row while
    it writes them (a commit appends its record there before, a marker settling pending offsets
    and a deletion's tombstones too), so none writes between this read and the caller's commit,
    on any server process. A read after the lock is a fresh snapshot (READ COMMITTED): it sees
    what the writers the lock waited for committed. (A topic's deletion removes its offsets as
    well: the committing caller holds the topics FOR KEY SHARE, which it waits for.)"""
    await lock_partitions(conn, PartitionLocks(frozenset({(offsets_topic.topic_id, offsets_partition)})))
    rows = await conn.fetch(
        "SELECT topic, partition, committed_offset, metadata, leader_epoch FROM group_offsets "
        "WHERE group_id = $1 AND (topic, partition) IN (SELECT * FROM unnest($2::text[], $3::int[]))",
        group_id,
        [topic for topic, _ in keys],
        [partition for _, partition in keys],
    )
    return {
        (r["topic"], r["partition"]): OffsetEntry(
            r["topic"], r["partition"], r["committed_offset"], offset_metadata.read(r["metadata"]), r["leader_epoch"]
        )
        for r in rows
    }


async def stage(
    conn: asyncpg.Connection,
    offsets_topic: TopicInfo,
    offsets_partition: int,
    group_id: str,
    entries: list[OffsetEntry],
    producer_id: int,
    producer_epoch: int,
    now_ms: int,
) -> None:
    """A TxnOffsetCommit: pending until the transaction's marker (a later one of the same
    transaction for the same partition replaces it). Its records are the transaction's."""
    if not entries:
        return
    batch = _commit_batch(group_id, entries, now_ms, {"producer_id": producer_id, "producer_epoch": producer_epoch})
    appended = await append_for_coordinator(conn, offsets_topic, offsets_partition, batch, producer_id, producer_epoch)
    await conn.executemany(
        "INSERT INTO pending_txn_offsets (group_id, topic, partition, producer_id, producer_epoch, offsets_partition, "
        "committed_offset, metadata, commit_timestamp_ms, record_offset, leader_epoch) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
        "ON CONFLICT (group_id, topic, partition, producer_id) DO UPDATE SET producer_epoch = EXCLUDED.producer_epoch, "
        "committed_offset = EXCLUDED.committed_offset, metadata = EXCLUDED.metadata, "
        "commit_timestamp_ms = EXCLUDED.commit_timestamp_ms, record_offset = EXCLUDED.record_offset, "
        "leader_epoch = EXCLUDED.leader_epoch",
        [
            (
                group_id,
                e.topic,
                e.partition,
                producer_id,
                producer_epoch,
                offsets_partition,
                e.offset,
                offset_metadata.stored(e.metadata),
                now_ms,
                appended.base_offset + index,
                e.leader_epoch,
            )
            for index, e in enumerate(entries)
        ],
    )


# Run in the PostgreSQL transaction that writes the marker, so the offsets become visible exactly
# when the marker does; the marker holds the offsets partition's row lock, which every commit to
# it takes too (it appends there first), so no commit of this group interleaves. A settled offset
# replaces only one committed by an earlier record (Kafka's "appended last wins"). Idempotent: a
# second run finds nothing pending.
_SETTLE_COMMIT_SQL = """
WITH settled AS (
    DELETE FROM pending_txn_offsets WHERE offsets_partition = $1 AND producer_id = $2 AND producer_epoch = $3
    RETURNING group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms, record_offset,
              leader_epoch
)
INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms,
                           record_offset, leader_epoch)
SELECT group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms, record_offset, leader_epoch
FROM settled
ON CONFLICT (group_id, topic, partition) DO UPDATE SET committed_offset = EXCLUDED.committed_offset,
    metadata = EXCLUDED.metadata, commit_timestamp_ms = EXCLUDED.commit_timestamp_ms,
    record_offset = EXCLUDED.record_offset, leader_epoch = EXCLUDED.leader_epoch
WHERE group_offsets.record_offset < EXCLUDED.record_offset
"""


async def settle(
    conn: asyncpg.Connection, offsets_partition: int, producer_id: int, producer_epoch: int, commit_: bool
) -> None:
    if commit_:
        await conn.execute(_SETTLE_COMMIT_SQL, offsets_partition, producer_id, producer_epoch)
    else:
        await conn.execute(
            "DELETE FROM pending_txn_offsets WHERE offsets_partition = $1 AND producer_id = $2 AND producer_epoch = $3",
            offsets_partition,
            producer_id,
            producer_epoch,
        )


# The offsets (committed or pending) of a group, of every partition ($2 false) or of the partitions
# listed ($3, $4).
_DELETED_KEYS_SQL = """
WITH wanted AS (SELECT * FROM unnest($3::text[], $4::int[]) AS w(topic, partition))
SELECT topic, partition FROM (
    SELECT topic, partition FROM group_offsets WHERE group_id = $1
    UNION SELECT topic, partition FROM pending_txn_offsets WHERE group_id = $1
) known
WHERE NOT $2 OR (topic, partition) IN (SELECT topic, partition FROM wanted)
ORDER BY topic, partition
"""
_DELETE_FROM_SQL = """
DELETE FROM {table} WHERE group_id = $1
AND (NOT $2 OR (topic, partition) IN (SELECT * FROM unnest($3::text[], $4::int[])))
"""


async def delete_offsets(
    conn: asyncpg.Connection,
    offsets_topic: TopicInfo,
    offsets_partition: int,
    group_id: str,
    now_ms: int,
    partitions: list[tuple[str, int]] | None = None,
) -> int:
    """Removes the group's offsets of these (topic, partition)s (None: of every partition),
    committed and pending transactional (a pending one's COMMIT then settles nothing), with a
    tombstone per (topic, partition) removed in its `__consumer_offsets` partition (as Kafka writes
    them; compaction then drops those records). Returns how many partitions had an offset.

    Safe under concurrency because the caller holds the group row FOR UPDATE (`groups.lock_existing`):
    every commit of the group, plain or transactional, holds that row first (`groups.hold`), so none
    is in flight or can begin. What remains is a transaction's marker settling pending offsets
    (`settle`), which holds the offsets partition's row: the tombstones' append takes that row
    first, so no settle runs from then until we commit, and one that committed before is seen by the
    DELETEs (READ COMMITTED: each statement's snapshot is taken after the append's wait). A settle
    between the read of the keys and the append only moves a key from pending to committed, or drops
    it: the tombstones still cover every key left."""
    chosen = partitions is not None
    topics, numbers = [t for t, _ in partitions or []], [p for _, p in partitions or []]
    keys = await conn.fetch(_DELETED_KEYS_SQL, group_id, chosen, topics, numbers)
    if not keys:
        return 0
    # Their topics held (FOR KEY SHARE, by name) before any of their rows is locked, as a commit
    # holds them: a DeleteTopics, which locks its topic's row first, then deletes its offsets in the
    # order of its scan of the table, deadlocked with the DELETEs below (in the index's order).
    await hold_topics(conn, sorted({key["topic"] for key in keys}))
    tombstones = [record_codec.TextRecord(_record_key(group_id, key["topic"], key["partition"]), None) for key in keys]
    await append_batch_or_raise(
        conn,
        BatchAppend(
            offsets_topic, offsets_partition, record_codec.encode_batch(tombstones, "utf8", now_ms, "offset deletion")
        ),
    )
    for table in ("pending_txn_offsets", "group_offsets"):
        await conn.execute(_DELETE_FROM_SQL.format(table=table), group_id, chosen, topics, numbers)
    return len(keys)


async def has_offsets(conn: asyncpg.Connection, group_id: str) -> bool:
    """Whether the group has an offset, committed or pending."""
    return await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM group_offsets WHERE group_id = $1) "
        "OR EXISTS (SELECT 1 FROM pending_txn_offsets WHERE group_id = $1)",
        group_id,
    )


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    topic: str
    partition: int
    offset: int
    metadata: str | None
    leader_epoch: int
    pending: bool  # a transactional commit for this partition awaits its marker


async def fetch(
    conn: asyncpg.Connection, group_id: str, partitions: list[tuple[str, int]] | None
) -> list[CommittedOffset]:
    """Visible committed offsets (NO_OFFSET and NO_LEADER_EPOCH where none), with whether a
    transactional one is pending.
    With partitions None: every partition the group has committed or has pending."""
    rows = await conn.fetch(
        "WITH wanted AS (SELECT * FROM unnest($2::text[], $3::int[]) AS w(topic, partition)), "
        "known AS (SELECT topic, partition FROM group_offsets WHERE group_id = $1 "
        "          UNION SELECT topic, partition FROM pending_txn_offsets WHERE group_id = $1), "
        "keys AS (SELECT topic, partition FROM wanted WHERE $4 "
        "         UNION ALL SELECT topic, partition FROM known WHERE NOT $4) "
        "SELECT k.topic, k.partition, o.committed_offset, o.metadata, o.leader_epoch, "
        "       EXISTS (SELECT 1 FROM pending_txn_offsets p WHERE p.group_id = $1 AND p.topic = k.topic "
        "               AND p.partition = k.partition) AS pending "
        "FROM keys k LEFT JOIN group_offsets o ON o.group_id = $1 AND o.topic = k.topic AND o.partition = k.partition "
        "ORDER BY k.topic, k.partition",
        group_id,
        [t for t, _ in partitions or []],
        [p for _, p in partitions or []],
        partitions is not None,
    )
    by_key = {
        (r["topic"], r["partition"]): CommittedOffset(
            r["topic"],
            r["partition"],
            NO_OFFSET if r["committed_offset"] is None else r["committed_offset"],
            offset_metadata.read(r["metadata"]),
            NO_LEADER_EPOCH if r["leader_epoch"] is None else r["leader_epoch"],
            r["pending"],
        )
        for r in rows
    }
    if partitions is None:
        return list(by_key.values())
    return [by_key[key] for key in partitions]


# Lag counts records, not markers: the offsets between a committed offset (or the log start, when it
# is past it: _POSITION_SQL) and the high watermark, less the transaction markers among them, an
# index range count on txn_markers' primary key. The
# count stops after MARKERS_COUNTED markers, so the lag of a group far behind on a partition of many
# transactions costs a bounded read (at most MARKERS_READ index entries per committed offset), not
# every marker of the partition (a million behind cost a describe a million entries); past them the
# lag is an upper bound (`lag_bounded`: the offsets ahead less MARKERS_READ markers, above the
# records' count by the markers not counted), while a consumer near the end has its exact lag. A
# negative committed offset (Kafka's OffsetCommit stores one as given: an admin tool's -1) is no
# position, so it has no lag (NULL), as kafka-consumer-groups.sh shows none for it. One rule for
# every reader of lag: HTTP's describe (`lags`) and the console's group pages
# (app/console/queries/group_summaries.py).
MARKERS_COUNTED = 1000
MARKERS_READ = MARKERS_COUNTED + 1  # one more than counted: whether there are more
# The SQL of that rule, over the aliases `o` (the group_offsets row) and `t` (its topic's topics
# row): LAG_JOINS_SQL joins each row its partition's high watermark (`hw.high_watermark`, NULL when
# the partition no longer exists) and log start (`hw.log_start_offset`), each one primary-key probe
# (a scalar subquery, so the plan stays a probe even before the tables have statistics), and the
# markers ahead (`mk.markers`), which LAG_SQL and LAG_BOUNDED_SQL read. OFFSET 0 keeps each join a
# subquery run once per row: pulled up into the query, its expression would be run again at each
# reference (the markers read twice, the high watermark probed four times).
_HIGH_WATERMARK_SQL = (
    "(SELECT p.high_watermark FROM partitions p WHERE p.topic_id = t.topic_id AND p.partition = o.partition)"
)
_LOG_START_SQL = (
    "(SELECT p.log_start_offset FROM partitions p WHERE p.topic_id = t.topic_id AND p.partition = o.partition)"
)
# Where the group's next read starts: its committed offset, or the log start when records were
# deleted past it (DeleteRecords, retention): those are no longer there to read, nor their markers,
# which the cleaner removes, so counting from the committed offset would count them as records.
_POSITION_SQL = "greatest(o.committed_offset, hw.log_start_offset)"
_MARKERS_AHEAD_SQL = f"""
(SELECT count(*) FROM (SELECT 1 FROM txn_markers m WHERE m.topic_id = t.topic_id AND m.partition = o.partition
     AND m.marker_offset >= {_POSITION_SQL} AND m.marker_offset < hw.high_watermark
     LIMIT {MARKERS_READ}) counted)
"""
LAG_JOINS_SQL = f"""
CROSS JOIN LATERAL (SELECT {_HIGH_WATERMARK_SQL} AS high_watermark, {_LOG_START_SQL} AS log_start_offset OFFSET 0) hw
CROSS JOIN LATERAL (SELECT {_MARKERS_AHEAD_SQL} AS markers OFFSET 0) mk
"""
LAG_SQL = f"""
CASE WHEN o.committed_offset >= 0 THEN greatest(hw.high_watermark - {_POSITION_SQL}, 0) - mk.markers END
"""
LAG_BOUNDED_SQL = f"(o.committed_offset >= 0 AND mk.markers > {MARKERS_COUNTED})"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed_offset: int
    metadata: str | None
    high_watermark: int
    lag: int | None  # records (not markers) from the committed offset to the high watermark (LAG_SQL)
    pending: bool
    leader_epoch: int  # the one committed with the offset (Kafka's OffsetCommit v6+); -1: none
    lag_bounded: bool = False  # more than MARKERS_COUNTED markers lie ahead: the lag is an upper bound


# Offsets of deleted topics and partitions are left out.
_LAGS_OF_GROUP_SQL = f"""
SELECT o.topic, o.partition, o.committed_offset, o.metadata, o.leader_epoch, hw.high_watermark,
       {LAG_SQL} AS lag, {LAG_BOUNDED_SQL} AS lag_bounded,
       EXISTS (SELECT 1 FROM pending_txn_offsets q WHERE q.group_id = o.group_id AND q.topic = o.topic
               AND q.partition = o.partition) AS pending
FROM group_offsets o
JOIN topics t ON t.name = o.topic
{LAG_JOINS_SQL}WHERE o.group_id = $1 AND hw.high_watermark IS NOT NULL
ORDER BY o.topic, o.partition
"""


def lags_from_rows(rows) -> list[PartitionLag]:
    """PartitionLag of rows with its fields' names, the metadata read back from its stored text."""
    return [replace(lag, metadata=offset_metadata.read(lag.metadata)) for lag in all_from_rows(PartitionLag, rows)]


async def lags(conn: asyncpg.Connection, group_id: str) -> list[PartitionLag]:
    return lags_from_rows(await conn.fetch(_LAGS_OF_GROUP_SQL, group_id))
