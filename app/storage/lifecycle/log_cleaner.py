"""The log's lifecycle: retention by time and size, DeleteRecords (KIP-107), compaction
(log_compaction.py), and the rows deleted topics leave behind. Run by a background worker
(coordinator/workers.py) on every server; DeleteRecords is `delete_records`, called by the API.

The rules, which every function here keeps:
- Offsets never change. Retention and DeleteRecords only advance `partitions.log_start_offset`
  (one short UPDATE; the API's reads never go below it); the batches below it are then deleted in
  bounded chunks, by primary-key range, each chunk its own PostgreSQL transaction. A crash between
  chunks loses nothing that should stay and the next run carries on where it stopped.
- Nothing at or past a partition's last stable offset is ever deleted or compacted: an open
  transaction's records stay whole until its marker is written.
- A transaction's marker (its control batch and its `txn_markers` row, which read_committed
  fetches look up to hide aborted batches) goes only once none of the transaction's batches is
  left to read, and never while the transaction is still being completed (PrepareCommit or
  PrepareAbort: recovery may re-write its markers, and finds them idempotent by that row). So
  read_committed stays exact at every offset >= the log start.
- Compaction keeps the latest record of each key (only committed records count: aborted ones are
  removed) and removes a tombstone (null value) `delete_retention_ms` after the cleaner first kept it. A batch
  keeps its offsets: a removed record leaves a hole (record_codec.with_holes); a batch with nothing
  left goes.
- One server cleans a partition at a time (a session advisory lock on (topic_id, partition), freed
  when the connection closes, so a crashed server never holds it); appends never take it, so
  cleaning never makes a produce wait, except for the one UPDATE that advances the log start.
"""

from __future__ import annotations

import logging

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.lifecycle import log_compaction
from app.storage.lifecycle.cleanup_progress import ASYNC_COMMIT_SQL, COMPLETING_STATES, CleanupTotals, note_cleanup
from app.storage.log import partition_log
from app.storage.log.partition_log import BATCH_BYTES_SQL, PartitionState
from app.storage.log.record_codec import UnreadableBatch
from app.storage.log.topics import (
    CLEANUP_COMPACT,
    CLEANUP_DELETE,
    RETENTION_FOREVER,
    TopicInfo,
    find_topic_by_id,
    unknown_partition,
)
from app.storage.rows import count_rows

log = logging.getLogger(__name__)

# DeleteRecords' offset meaning "up to the high watermark" (Kafka's DeleteRecordsRequest.HIGH_WATERMARK).
HIGH_WATERMARK = -1

# ---- DeleteRecords


def check_records_deletable(topic: TopicInfo) -> None:
    if topic.is_internal:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic {topic.name!r} is internal to txbroker: the server compacts its records, clients "
            f"cannot delete them",
        )


async def delete_records(conn: asyncpg.Connection, topic: TopicInfo, partition: int, offset: int) -> int:
    """Advances the partition's log start to `offset` (HIGH_WATERMARK: to the high watermark) and
    returns the new log start (Kafka's low watermark); the cleaner removes the batches below it.
    POLICY_VIOLATION for a topic whose cleanup policy lacks delete (checked after the partition, as
    Kafka's Partition.deleteRecordsOnLeader: a compacted log's start only the cleaner moves);
    OFFSET_OUT_OF_RANGE past the high watermark, or past the last stable offset (an open
    transaction's records are never deleted)."""
    if not 0 <= partition < topic.partition_count:
        raise unknown_partition(topic, partition)
    if CLEANUP_DELETE not in topic.cleanup_policy:
        raise BrokerError(
            ErrorCode.POLICY_VIOLATION,
            f"records of partition {partition} of topic {topic.name!r} cannot be deleted: its cleanup_policy "
            f"(cleanup.policy) is {topic.setting('cleanup_policy')!r}, and only a topic whose policy includes "
            f"{CLEANUP_DELETE!r} may have records deleted (as Kafka); add {CLEANUP_DELETE!r} to the policy first",
        )
    async with conn.transaction():
        # The partition's row lock orders this against appends and markers: the LSO read under it
        # cannot move below what it says until commit.
        if (
            await conn.fetchval(
                "SELECT 1 FROM partitions WHERE topic_id = $1 AND partition = $2 FOR UPDATE", topic.topic_id, partition
            )
            is None
        ):
            raise unknown_partition(topic, partition)
        state = await partition_log.partition_state(conn, topic, partition)
        target = state.high_watermark if offset == HIGH_WATERMARK else offset
        where = f"{topic.name}-{partition}"
        if not 0 <= target <= state.high_watermark:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"cannot delete the records of {where} before offset {offset}: expected an offset from 0 to "
                f"the high watermark {state.high_watermark}, or {HIGH_WATERMARK} for all of them",
            )
        if target > state.last_stable_offset:
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"cannot delete the records of {where} before offset {target}: an open transaction's records "
                f"start at {state.last_stable_offset} (the last stable offset) and are never deleted; delete "
                f"up to {state.last_stable_offset}, or retry once the transaction is complete",
            )
        return await conn.fetchval(
            "UPDATE partitions SET log_start_offset = greatest(log_start_offset, $3) "
            "WHERE topic_id = $1 AND partition = $2 RETURNING log_start_offset",
            topic.topic_id,
            partition,
            target,
        )


# ---- retention

# The first batch a time-based retention keeps: the first, in log order, with a record as new as the
# cutoff (Kafka deletes whole segments from the start while their newest record is older), or, when its
# records have no timestamp (-1), appended since the cutoff (as Kafka goes by a segment's last-modified
# time when none of its records has one: LogSegment.largestTimestamp).
_FIRST_RECENT_SQL = """
SELECT base_offset FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3
  AND coalesce(untimestamped_appended_ms, max_timestamp_ms) >= $4
ORDER BY last_offset LIMIT 1
"""

# The first batch a size-based retention keeps: the oldest whose newer batches alone total less than
# retention_bytes. As Kafka deletes its oldest segments only while what would remain is at least
# retention.bytes: a log above the limit keeps at least the limit, never less; and the newest batch
# always stays (a single batch larger than the limit is the log's whole content, not nothing).
# Markers count as the control batches they are in Kafka's log (partition_log.BATCH_BYTES_SQL).
_FIRST_WITHIN_SIZE_SQL = f"""
SELECT base_offset FROM (
    SELECT base_offset, last_offset,
           sum({BATCH_BYTES_SQL}) OVER (ORDER BY last_offset DESC)
               - {BATCH_BYTES_SQL} AS newer_bytes,
           row_number() OVER (ORDER BY last_offset DESC) AS from_newest
    FROM record_batches r WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3
) b WHERE newer_bytes < $4 OR from_newest = 1 ORDER BY last_offset LIMIT 1
"""


# A partition's stored bytes as retention by size counts them (_FIRST_WITHIN_SIZE_SQL): the
# bytes of its batches from the log start on (those below it are the cleaner's to delete and
# no longer the log's). One statement, so one snapshot of every partition of the topic.
_STORED_BYTES_SQL = f"""
SELECT p.partition, coalesce(sum({BATCH_BYTES_SQL}), 0) AS stored_bytes
FROM partitions p
LEFT JOIN record_batches b
  ON b.topic_id = p.topic_id AND b.partition = p.partition AND b.last_offset >= p.log_start_offset
WHERE p.topic_id = $1
GROUP BY p.partition
"""


async def stored_bytes(conn: asyncpg.Connection, topic: TopicInfo) -> dict[int, int]:
    """Each partition's stored bytes, as retention by size (`retention_bytes`) counts them."""
    return {row["partition"]: row["stored_bytes"] for row in await conn.fetch(_STORED_BYTES_SQL, topic.topic_id)}


async def retention_target(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, state: PartitionState, now_ms: int
) -> int:
    """Where retention would put the log start now: never past the LSO, never backwards, and only
    past batches it deletes (offsets compaction emptied before the first batch do not count)."""
    retention_ms, retention_bytes = topic.setting("retention_ms"), topic.setting("retention_bytes")
    kept: list[int | None] = []  # per rule, the first batch it keeps (None: none)
    if retention_ms != RETENTION_FOREVER:
        kept.append(
            await conn.fetchval(
                _FIRST_RECENT_SQL, topic.topic_id, partition, state.log_start_offset, now_ms - retention_ms
            )
        )
    if retention_bytes != RETENTION_FOREVER:
        kept.append(
            await conn.fetchval(
                _FIRST_WITHIN_SIZE_SQL, topic.topic_id, partition, state.log_start_offset, retention_bytes
            )
        )
    if not kept:
        return state.log_start_offset
    first_present = await conn.fetchval(_FIRST_RECENT_SQL, topic.topic_id, partition, state.log_start_offset, -(2**63))
    if first_present is None:  # nothing stored from the log start on
        return state.log_start_offset
    target = max(state.high_watermark if first is None else first for first in kept)
    if target <= first_present:
        return state.log_start_offset  # every rule keeps the first batch: nothing expired
    return max(state.log_start_offset, min(target, state.last_stable_offset))


async def _apply_retention(conn: asyncpg.Connection, topic: TopicInfo, partition: int, now_ms: int) -> None:
    state = await partition_log.partition_state(conn, topic, partition)
    target = await retention_target(conn, topic, partition, state, now_ms)
    if target > state.log_start_offset:
        # Safe against a racing transaction: a transaction that begins after the state was read
        # starts at or past the high watermark read then, which is >= the LSO read, which is >= target.
        await conn.execute(
            "UPDATE partitions SET log_start_offset = greatest(log_start_offset, $3) "
            "WHERE topic_id = $1 AND partition = $2",
            topic.topic_id,
            partition,
            target,
        )


# ---- removing what is below the log start

# One chunk of the batches wholly below the log start: a primary-key range, from the partition's
# first batch to the lower of the log start and the chunk's last batch. Both bounds are scalar
# subqueries, computed once, so it is one index range scan whatever the planner's statistics say
# (as a join with the chunk's rows, fresh rows estimated at 1 made it a nested loop, a scan per
# batch; `python -m bench.soak --removal-batches N` measures removal). Re-running it after a crash
# deletes what is left.
_DELETE_BELOW_START_SQL = """
DELETE FROM record_batches
WHERE topic_id = $1 AND partition = $2
  AND last_offset < (SELECT log_start_offset FROM partitions WHERE topic_id = $1 AND partition = $2)
  AND last_offset <= coalesce((SELECT last_offset FROM record_batches WHERE topic_id = $1 AND partition = $2
                               ORDER BY last_offset OFFSET $3 - 1 LIMIT 1), 9223372036854775807)
"""

# Markers below the log start whose transaction has no batch left: those below the partition's first
# batch still stored, which this chunk's DELETE above (same PostgreSQL transaction) has removed. A
# transaction's batches precede its marker, so none of them is left to read; a marker merely below
# the log start is not enough, as a fetch in flight, which checked the log start before this chunk
# (partition_log.read), may still read the batches a later chunk deletes, and an ABORT marker gone
# before them would show their records to read_committed. Those of a transaction still being
# completed stay too (see the module's rules). Appends only add batches past the high watermark, and
# one cleaner holds the partition's lock, so the first batch cannot move back. Oldest first, so each
# chunk removes those its batches freed. (The bounds are scalar subqueries, computed once, so the
# marker index is range-scanned: as a join, PostgreSQL may not bound the scan by them.)
_DELETE_MARKERS_BELOW_START_SQL = """
DELETE FROM txn_markers WHERE ctid IN (
    SELECT m.ctid FROM txn_markers m
    WHERE m.topic_id = $1 AND m.partition = $2
      AND m.marker_offset < (SELECT log_start_offset FROM partitions WHERE topic_id = $1 AND partition = $2)
      AND m.marker_offset < coalesce((SELECT last_offset FROM record_batches WHERE topic_id = $1 AND partition = $2
                                      ORDER BY last_offset LIMIT 1), 9223372036854775807)
      AND NOT EXISTS (SELECT 1 FROM transactions t WHERE t.state = ANY($4::text[])
                      AND t.txn_producer_id = m.producer_id AND t.txn_producer_epoch = m.producer_epoch)
    ORDER BY m.marker_offset
    LIMIT $3)
"""


async def _remove_below_start(
    conn: asyncpg.Connection, topic_id: int, partition: int, chunk: int, totals: CleanupTotals
) -> None:
    while True:
        async with conn.transaction():
            await conn.execute(ASYNC_COMMIT_SQL)
            batches = count_rows(await conn.execute(_DELETE_BELOW_START_SQL, topic_id, partition, chunk))
            markers = count_rows(
                await conn.execute(_DELETE_MARKERS_BELOW_START_SQL, topic_id, partition, chunk, COMPLETING_STATES)
            )
            if batches or markers:
                await note_cleanup(conn, topic_id, partition, batches, 0)
        totals.removed_batches += batches
        totals.removed_markers += markers
        if batches < chunk and markers < chunk:
            return


# ---- one partition, every partition


async def clean_partition(
    conn: asyncpg.Connection, topic_id: int, partition: int, now_ms: int, chunk: int, totals: CleanupTotals
) -> bool:
    """Applies the topic's cleanup policy to one partition; False if another server is at it, or
    its topic is gone. The topic's config is read once the partition is this run's, never earlier:
    a run takes its partitions one after the other, for as long as their work lasts, and a config
    changed meanwhile (retention raised, cleanup_policy changed, on any node) applies to every
    partition it takes after the change commits."""
    # Only while the topic exists, its row held (FOR KEY SHARE, as appends hold it: they never wait
    # for each other) until the row is in: a run lists its partitions first, and one of a topic
    # deleted since, whose rows another server's run has removed already, would leave a row nothing
    # removes. A DeleteTopics (FOR UPDATE of the topic) waits for the insert, and its deleted_topics
    # row then takes this row with the rest.
    await conn.execute(
        "INSERT INTO partition_cleanups (topic_id, partition) "
        "SELECT topic_id, $2 FROM topics WHERE topic_id = $1 FOR KEY SHARE "
        "ON CONFLICT DO NOTHING",
        topic_id,
        partition,
    )
    # Session-level, so it spans the chunks' transactions; PostgreSQL frees it if this server dies.
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", topic_id, partition):
        return False
    try:
        topic = await find_topic_by_id(conn, topic_id)
        if topic is None:  # deleted since the run listed it: remove_deleted_topics takes its rows
            return False
        policy = topic.cleanup_policy
        if CLEANUP_DELETE in policy:
            await _apply_retention(conn, topic, partition, now_ms)
        await _remove_below_start(conn, topic.topic_id, partition, chunk, totals)
        if CLEANUP_COMPACT in policy:
            await log_compaction.compact(conn, topic, partition, now_ms, chunk, totals)
        totals.partitions += 1
        return True
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1, $2)", topic_id, partition)


# The partitions with something to do: retention configured, batches or markers left below the log
# start (DeleteRecords, or a run cut short), or a compacted partition with new offsets or a
# tombstone due. Cheap probes: the first batch or marker of each partition by index (scalar
# subqueries with LIMIT, which PostgreSQL runs per partition, never as a join over the whole table).
_CANDIDATES_SQL = """
SELECT t.topic_id, t.name, p.partition FROM topics t JOIN partitions p ON p.topic_id = t.topic_id
LEFT JOIN partition_cleanups c ON c.topic_id = p.topic_id AND c.partition = p.partition
WHERE (t.config->>'cleanup_policy' LIKE '%delete%'
       AND ((t.config->>'retention_ms')::bigint >= 0 OR (t.config->>'retention_bytes')::bigint >= 0))
   OR (t.config->>'cleanup_policy' LIKE '%compact%'
       AND (p.high_watermark > coalesce(c.compacted_through, 0)
            OR c.earliest_tombstone_seen_ms <= $1 - (t.config->>'delete_retention_ms')::bigint))
   OR (SELECT true FROM record_batches b WHERE b.topic_id = p.topic_id AND b.partition = p.partition
       AND b.last_offset < p.log_start_offset LIMIT 1)
   OR (SELECT true FROM txn_markers m WHERE m.topic_id = p.topic_id AND m.partition = p.partition
       AND m.marker_offset < p.log_start_offset LIMIT 1)
ORDER BY t.topic_id, p.partition
"""


async def clean(pool: asyncpg.Pool, now_ms: int, chunk: int) -> CleanupTotals:
    """One cleaner run over every partition that needs it, then the deleted topics' rows."""
    totals = CleanupTotals()
    async with pool.acquire() as conn:
        for row in await conn.fetch(_CANDIDATES_SQL, now_ms):
            try:
                await clean_partition(conn, row["topic_id"], row["partition"], now_ms, chunk, totals)
            except UnreadableBatch as error:
                # As Kafka's cleaner with an uncleanable partition: the others are cleaned; this one
                # is compacted again once the row is fixed (its first pass reads before it writes).
                log.error("log cleaner: %s-%d is not compacted: %s", row["name"], row["partition"], error.message)
            except BrokerError as error:
                if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
                # Deleted since it was listed: remove_deleted_topics takes care of its rows.
        await remove_deleted_topics(conn, chunk, totals)
    return totals


# ---- deleted topics

# A chunk of each table's rows of one deleted topic (ctid: whatever the table's key, one probe per row).
_DELETE_TOPIC_ROWS_SQL = tuple(
    "DELETE FROM " + table + " WHERE ctid IN (SELECT ctid FROM " + table + " WHERE topic_id = $1 LIMIT $2)"
    for table in ("record_batches", "txn_markers", "producer_states", "partition_cleanups")
)


async def remove_deleted_topics(conn: asyncpg.Connection, chunk: int, totals: CleanupTotals) -> None:
    """Removes the rows of deleted topics, a chunk per table per PostgreSQL transaction. Each
    deleted_topics row is held (FOR UPDATE SKIP LOCKED) while its chunk runs, so servers share the
    work, and goes when nothing of its topic is left."""
    while True:
        async with conn.transaction():
            topic_id = await conn.fetchval(
                "SELECT topic_id FROM deleted_topics ORDER BY topic_id LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            if topic_id is None:
                return
            removed = 0
            for statement in _DELETE_TOPIC_ROWS_SQL:
                removed += count_rows(await conn.execute(statement, topic_id, chunk))
            totals.deleted_topic_rows += removed
            if removed == 0:
                await conn.execute("DELETE FROM deleted_topics WHERE topic_id = $1", topic_id)
