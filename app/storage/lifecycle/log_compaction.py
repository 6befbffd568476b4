"""Compaction (cleanup_policy "compact", as Kafka's log cleaner): keep the latest committed record of
each key, at its offset, and remove tombstones (null values) `delete_retention_ms` after the cleaner
first kept them (Kafka's delete horizon, KIP-534).

Rules (with log_cleaner.py's, which runs it):
- Offsets never change: a batch keeps its base and last offset, a record it loses leaves a hole
  (record_codec.with_holes; readers skip them), and a batch with nothing left goes.
- A run compacts the log below its `end`, and nothing at or past it is touched nor supersedes a
  record before it: the LSO (an open transaction's records stay whole), or before it the first batch
  written since the last run whose newest record is within the topic's `min_compaction_lag_ms` of the
  cleaner's clock (Kafka's min.compaction.lag.ms, 0 by default; by the batch's max timestamp, as
  Kafka's LogCleanerManager.cleanableOffsets goes by a segment's largest timestamp; by its append
  time, `untimestamped_appended_ms`, when its records have none, as Kafka's goes by a segment's
  last-modified time then). So a record stays readable, superseded or not, until it is that old, and
  so does everything after it.
- Only committed records count: aborted batches go, and their keys never hide an older committed
  value. A transaction's marker (control batch and `txn_markers` row) goes only once none of its
  records is left, in the same or a later PostgreSQL transaction than its last batch, and never while
  the transaction is being completed; so read_committed stays exact.
- The log's last batch (the one ending at the high watermark the run read) stays as it is: never
  removed, rewritten or stamped, as Kafka's cleaner never cleans the active segment, which holds it
  (and keeps a producer's last marker, LogCleaner's "the last entry in the log is a transaction
  marker"). Its records supersede older ones as any batch's do. So a log always ends in a batch: a
  reader anywhere below the high watermark reads up to it and reaches it, where an emptied tail left
  a Kafka consumer's position short of it for good (Kafka's consumers move only by the batches
  they fetch). A marker at the end stays too, also once its transaction's records are gone (aborted
  ones, superseded or expired ones): consumers step over it to the high watermark. It goes, and its
  tombstones age, at a run after a batch follows it.
- A tombstone's age is the cleaner's, never the record's timestamp (the client's: it may be days old
  when appended, and a consumer must still get `delete_retention_ms` to read it). The first run that
  keeps a batch's tombstone stamps the batch (`record_batches.tombstones_seen_ms`, in the page's
  PostgreSQL transaction; lost in a crash, a later run stamps it later: kept longer, never shorter);
  a tombstone goes once `delete_retention_ms` has passed since then (at once if it is 0).
- A run reads the whole log below its end, so it waits until the topic's `min_cleanable_dirty_ratio`
  of it (Kafka's min.cleanable.dirty.ratio, 0.5 by default; in batches, those past the end counting
  neither way, as Kafka's cleanable ratio) is new since the last run, a batch written since is older
  than its `max_compaction_lag_ms` (by its max timestamp, as Kafka's by a segment's first batch's;
  one without a timestamp never, as Kafka's leaves it out; no bound by default) and
  something new lies below the end (the maximum lag forces only what the minimum allows, as Kafka's
  needCompactionNow), or a kept tombstone is due to go.
- Two passes: the first (read-only) maps every key to its latest committed offset from the log start
  to the end; the second rewrites a page of batches per PostgreSQL transaction, from the partition's
  first stored batch (a DeleteRecords that raced the cleaner may have left some below the log start:
  a marker goes only once the pass has seen every batch of its transaction still stored). Removing
  a record an older map says is superseded stays right whatever happened since, so a run cut short
  by a crash is simply run again (idempotent), and a server racing another (the advisory lock
  prevents it) would do no harm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from app.storage.database import NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL
from app.storage.lifecycle.cleanup_progress import ASYNC_COMMIT_SQL, COMPLETING_STATES, CleanupTotals, note_cleanup
from app.storage.log import partition_log, record_codec
from app.storage.log.topics import TopicInfo
from app.storage.rows import count_rows


@dataclass(slots=True)
class _Latest:
    """The latest committed record of a key below the compaction's end."""

    offset: int
    is_tombstone: bool


@dataclass(slots=True)
class _CompactionPass:
    topic: TopicInfo
    partition: int
    end: int  # nothing at or past it is touched or read (_compaction_end)
    now_ms: int
    delete_retention_ms: int
    # The last offset of the log's last batch when the run began (the high watermark - 1): that batch
    # stays as written (the module's rules).
    last_batch_offset: int
    latest: dict[bytes, _Latest] = field(default_factory=dict)
    # Per producer (id, epoch) seen so far in log order: whether a record of its open transaction is
    # kept. Its marker pops the entry, so transactions that share an epoch (transaction version 1)
    # are counted each on its own.
    transactions_kept: dict[tuple[int, int], bool] = field(default_factory=dict)
    earliest_tombstone_seen_ms: int | None = None  # of the tombstones kept: when the cleaner first kept them


_PAGE_SQL = """
SELECT base_offset, last_offset, producer_id, producer_epoch, is_transactional, control_type, tombstones_seen_ms,
       CASE WHEN control_type IS NULL THEN records END AS records
FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $4
ORDER BY last_offset LIMIT $5
"""


# A page's batches are decoded and judged in Python inside its transaction, between its first
# statement and its writes: on a page of large batches that takes longer than the request pool's
# idle_in_transaction_session_timeout (`database_idle_in_transaction_timeout_ms`, there for a node
# that hangs mid-request), and such a page would then never be compacted. The transaction locks
# nothing until its writes, so a hung cleaner holds up no producer, reader or other cleaner.
COMPACTION_PAGE_SQL = f"{ASYNC_COMMIT_SQL}; {NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL}"


async def _pages(conn: asyncpg.Connection, topic_id: int, partition: int, start: int, end: int, page: int):
    """The batches from `start` to `end`, in log order, a page (one statement) at a time."""
    while start < end:
        rows = await conn.fetch(_PAGE_SQL, topic_id, partition, start, end, page)
        if not rows:
            return
        yield rows
        start = rows[-1]["last_offset"] + 1
        if len(rows) < page:
            return


async def _map_latest(conn: asyncpg.Connection, run: _CompactionPass, start: int, page: int) -> None:
    """First pass, read-only: the latest committed record of every key below the end."""
    async for rows in _pages(conn, run.topic.topic_id, run.partition, start, run.end, page):
        # Every batch here is below the LSO, so its transaction is decided and its marker row
        # exists (markers go only with or after their batches): "not aborted" means committed.
        aborted = await partition_log.aborted_among(conn, run.topic.topic_id, run.partition, rows)
        for row in rows:
            if row["control_type"] is not None or row["last_offset"] in aborted:
                continue
            for index, stored in enumerate(record_codec.decode_payload(row["records"], row["base_offset"])):
                key = None if stored is None else record_codec.key_bytes(stored)
                if key is not None:
                    run.latest[key] = _Latest(row["base_offset"] + index, stored[2] is None)


def _keeps(run: _CompactionPass, offset: int, stored: list | None, tombstones_seen_ms: int | None) -> bool:
    """Whether the record at `offset` stays; `tombstones_seen_ms`: its batch's stamp (None: this run
    is the first to see its tombstones, if it has any)."""
    if stored is None:
        return False
    key = record_codec.key_bytes(stored)
    if key is None:  # nothing can supersede a record without a key
        return True
    latest = run.latest.get(key)
    if latest is None or latest.offset != offset:
        return False
    if latest.is_tombstone:
        seen = run.now_ms if tombstones_seen_ms is None else tombstones_seen_ms
        if seen + run.delete_retention_ms <= run.now_ms:
            return False
        earliest = run.earliest_tombstone_seen_ms
        run.earliest_tombstone_seen_ms = seen if earliest is None else min(earliest, seen)
    return True


async def _compact_page(
    conn: asyncpg.Connection, run: _CompactionPass, rows: list[asyncpg.Record], totals: CleanupTotals
) -> None:
    """Second pass, one page in one PostgreSQL transaction: drop or rewrite its batches, then the
    markers of transactions with nothing left. Idempotent: a re-run finds nothing more to drop."""
    topic_id, partition = run.topic.topic_id, run.partition
    aborted = await partition_log.aborted_among(conn, topic_id, partition, rows)
    removed: list[int] = []  # last_offset of batches to delete
    rewritten: list[tuple[int, bytes, int, int, int]] = []
    stamped: list[int] = []  # last_offset of batches whose tombstones this run is the first to keep
    markers: list[tuple[int, int, int]] = []  # (last_offset, producer id, epoch) of markers to delete
    for row in rows:
        transaction = (row["producer_id"], row["producer_epoch"])
        is_last_batch = row["last_offset"] == run.last_batch_offset
        if row["control_type"] is not None:
            if not run.transactions_kept.pop(transaction, False) and not is_last_batch:
                markers.append((row["last_offset"], *transaction))
            continue
        if is_last_batch:
            # Kept whole, its tombstones unstamped: a tombstone it cannot lose must not make every
            # run a due one (earliest_tombstone_seen_ms); its age starts once a batch follows it.
            if row["is_transactional"]:
                run.transactions_kept[transaction] = True
            continue
        if row["last_offset"] in aborted:
            removed.append(row["last_offset"])
            continue
        stored = record_codec.decode_payload(row["records"], row["base_offset"])
        seen = row["tombstones_seen_ms"]
        keep = [_keeps(run, row["base_offset"] + index, record, seen) for index, record in enumerate(stored)]
        if seen is None and any(kept and record[2] is None for kept, record in zip(keep, stored, strict=True)):
            stamped.append(row["last_offset"])
        if row["is_transactional"]:
            run.transactions_kept[transaction] = run.transactions_kept.get(transaction, False) or any(keep)
        if not any(keep):
            removed.append(row["last_offset"])
        elif not all(keep) and keep != [record is not None for record in stored]:
            rewritten.append((row["last_offset"], *record_codec.with_holes(stored, keep)))
    if removed:
        await conn.execute(
            "DELETE FROM record_batches WHERE topic_id = $1 AND partition = $2 AND last_offset = ANY($3::bigint[])",
            topic_id,
            partition,
            removed,
        )
    if rewritten:
        await conn.executemany(
            "UPDATE record_batches SET records = $4, size_bytes = $5, first_timestamp_ms = $6, max_timestamp_ms = $7 "
            "WHERE topic_id = $1 AND partition = $2 AND last_offset = $3",
            [(topic_id, partition, *values) for values in rewritten],
        )
    if stamped:
        # Only where unset: a stamp is never moved later (a rerun after a crash finds it set).
        await conn.execute(
            "UPDATE record_batches SET tombstones_seen_ms = $4 WHERE topic_id = $1 AND partition = $2 "
            "AND last_offset = ANY($3::bigint[]) AND tombstones_seen_ms IS NULL",
            topic_id,
            partition,
            stamped,
            run.now_ms,
        )
    removed_markers = 0
    if markers:
        # After the batches above, in the same transaction; a transaction still being completed
        # keeps its marker (the module's rules).
        removed_markers = count_rows(
            await conn.execute(
                "WITH doomed AS (DELETE FROM txn_markers m USING unnest($3::bigint[], $4::bigint[], $5::smallint[]) "
                "    AS d(marker_offset, producer_id, producer_epoch) "
                "  WHERE m.topic_id = $1 AND m.partition = $2 AND m.producer_id = d.producer_id "
                "    AND m.producer_epoch = d.producer_epoch AND m.marker_offset = d.marker_offset "
                "    AND NOT EXISTS (SELECT 1 FROM transactions t WHERE t.state = ANY($6::text[]) "
                "                    AND t.txn_producer_id = m.producer_id "
                "                    AND t.txn_producer_epoch = m.producer_epoch) "
                "  RETURNING m.marker_offset) "
                "DELETE FROM record_batches b USING doomed WHERE b.topic_id = $1 AND b.partition = $2 "
                "  AND b.last_offset = doomed.marker_offset",
                topic_id,
                partition,
                *map(list, zip(*markers)),
                COMPLETING_STATES,
            )
        )
    if removed or rewritten or removed_markers:
        await note_cleanup(conn, topic_id, partition, len(removed) + removed_markers, len(rewritten))
    totals.removed_batches += len(removed)
    totals.rewritten_batches += len(rewritten)
    totals.removed_markers += removed_markers


_BATCH_COUNTS_SQL = """
SELECT count(*) AS total, count(*) FILTER (WHERE last_offset >= $5) AS dirty FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $4
"""


# The first batch written since the last run, below the LSO, whose newest record is within
# min.compaction.lag.ms (its max timestamp later than $5, now minus the lag; for a batch whose records
# have no timestamp, its append time).
_FIRST_WITHIN_MIN_LAG_SQL = """
SELECT base_offset FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $4
  AND coalesce(untimestamped_appended_ms, max_timestamp_ms) > $5
ORDER BY last_offset LIMIT 1
"""


async def _compaction_end(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, compacted_through: int, lso: int, now_ms: int
) -> int:
    """Where a run stops (Kafka's first uncleanable dirty offset): the LSO, or before it the first
    batch written since the last run whose newest record is within the topic's min.compaction.lag.ms.
    Only the batches written since the last run are looked at, as Kafka's cleaner looks only at its
    dirty segments: those below were compacted when old enough, whatever their timestamps. A batch
    whose records have no timestamp (-1) goes by when it was appended, as Kafka's cleaner goes by
    its segment's last-modified time (LogSegment.largestTimestamp) when no record has one."""
    min_lag_ms = topic.setting("min_compaction_lag_ms")
    if min_lag_ms == 0:
        return lso
    first_within = await conn.fetchval(
        _FIRST_WITHIN_MIN_LAG_SQL, topic.topic_id, partition, compacted_through, lso, now_ms - min_lag_ms
    )
    return lso if first_within is None else max(first_within, compacted_through)


# A batch written since the last run, below the LSO, whose max timestamp is before $5 (now minus
# max.compaction.lag.ms), leaving out a batch without one (-1) and 0, as Kafka's cleaner keeps only
# positive first-batch timestamps.
_OVERDUE_SQL = """
SELECT true FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $4
  AND max_timestamp_ms > 0 AND max_timestamp_ms < $5
LIMIT 1
"""


async def _overdue(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, compacted_through: int, end: int, now_ms: int
) -> bool:
    """Kafka's max.compaction.lag.ms: a record not yet compacted may wait for the dirty ratio at most
    this long, then the partition is compacted anyway. Its age is its batch's max timestamp, as
    Kafka's LogCleanerManager.maxCompactionDelay takes each dirty segment's first batch's (a batch
    here is the unit a segment is there); a batch without a timestamp (its records' all -1) has no
    age and never forces a run, as Kafka leaves such a segment out (unlike min.compaction.lag.ms and
    retention, which go by its append time, as Kafka's go by a segment's last-modified time)."""
    max_lag_ms = topic.setting("max_compaction_lag_ms")
    if max_lag_ms >= now_ms:  # the default, 2^63-1: no bound
        return False
    return bool(
        await conn.fetchval(_OVERDUE_SQL, topic.topic_id, partition, compacted_through, end, now_ms - max_lag_ms)
    )


async def compact(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, now_ms: int, page: int, totals: CleanupTotals
) -> None:
    state = await partition_log.partition_state(conn, topic, partition)
    delete_retention_ms = topic.setting("delete_retention_ms")
    progress = await conn.fetchrow(
        "SELECT compacted_through, earliest_tombstone_seen_ms FROM partition_cleanups "
        "WHERE topic_id = $1 AND partition = $2",
        topic.topic_id,
        partition,
    )
    earliest_seen = progress["earliest_tombstone_seen_ms"]
    compacted_through = progress["compacted_through"]
    tombstones_due = earliest_seen is not None and earliest_seen + delete_retention_ms <= now_ms
    end = await _compaction_end(conn, topic, partition, compacted_through, state.last_stable_offset, now_ms)
    if not tombstones_due:
        if end <= compacted_through:
            return  # nothing new below the end since the last compaction, and no tombstone to drop yet
        # Kafka's min.cleanable.dirty.ratio, in batches: a run reads the whole log, so it waits until
        # the batches written since the last one are a good share of it (an index-only count).
        counts = await conn.fetchrow(
            _BATCH_COUNTS_SQL, topic.topic_id, partition, state.log_start_offset, end, compacted_through
        )
        if counts["dirty"] < topic.setting("min_cleanable_dirty_ratio") * counts["total"] and not await _overdue(
            conn, topic, partition, compacted_through, state.last_stable_offset, now_ms
        ):
            return
    run = _CompactionPass(topic, partition, end, now_ms, delete_retention_ms, state.high_watermark - 1)
    await _map_latest(conn, run, state.log_start_offset, page)
    # The second pass pages from the partition's first stored batch, not from the log start: a
    # DeleteRecords since the cleaner removed what was below the log start leaves batches there
    # until the next run, and a marker may go only once this pass has seen every batch of its
    # transaction still stored (a fetch in flight, which checked the log start before, may still
    # read them). Those below the log start lose every keyed record (the map names none of their offsets)
    # and go, with their markers after them, as _remove_below_start would have them go.
    async for rows in _pages(conn, topic.topic_id, partition, 0, run.end, page):
        async with conn.transaction():
            await conn.execute(COMPACTION_PAGE_SQL)
            await _compact_page(conn, run, rows, totals)
    # Committed synchronously: its WAL, and with it every chunk's before it, is durable.
    await conn.execute(
        "UPDATE partition_cleanups SET last_cleanup_ms = $3, compacted_through = $4, earliest_tombstone_seen_ms = $5 "
        "WHERE topic_id = $1 AND partition = $2",
        topic.topic_id,
        partition,
        now_ms,
        run.end,
        run.earliest_tombstone_seen_ms,
    )
