"""The partition log: append batches with dense offsets, read them back, find offsets.

Invariants:
- Offsets of a partition are dense and unique: an append first bumps the partition's
  `high_watermark` (taking that row's lock until commit), then inserts its batch at the old value, in
  one statement. Concurrent appends to one partition therefore queue on the row; appends to other
  partitions never wait. A multi-partition append locks its partitions in (topic_id, partition)
  order, so two of them cannot deadlock.
- A reader sees a batch exactly when it sees the high watermark that covers it (same PostgreSQL
  transaction), and bounds every read by the watermark it read first, so it never sees a hole.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import orjson

from app.clock import now_ms
from app.errors import BrokerError, ErrorCode
from app.storage import record_codec, sequences
from app.storage.fused_writes import WriteStatement, execute_fused
from app.storage.record_codec import EncodedBatch
from app.storage.topics import TOPIC_COLUMNS, TopicInfo, could_exist, topic_from_row, unknown_partition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)

# Control record types, as Kafka's ControlRecordType.
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
NO_OFFSET = -1
NO_TIMESTAMP = -1

APPENDS_CHANNEL = "txbroker_appends"

# The columns of a record_batches row, in the order every INSERT of a batch lists them (plain,
# idempotent and transactional batches, markers' control batches, the transaction log's records).
BATCH_COLUMNS = (
    "topic_id, partition, base_offset, last_offset, producer_id, producer_epoch, base_sequence, is_transactional, "
    "control_type, first_timestamp_ms, max_timestamp_ms, record_count, size_bytes, records"
)

# The most batches one partition read looks at: bounds a fetch's cost when a long run of aborted
# batches or markers returns nothing.
MAX_BATCHES_SCANNED = 20_000


def notification_key(topic_id: int, partition: int) -> str:
    return f"{topic_id}:{partition}"


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """One partition's part of a produce request, validated and encoded."""

    topic: TopicInfo
    partition: int
    batch: EncodedBatch
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    is_transactional: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int

    def upper_bound(self, isolation_level: str) -> int:
        """The first offset a reader at this isolation level may not see."""
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark


@dataclass(slots=True)
class ReadResult:
    state: PartitionState
    records: list[dict]
    next_offset: int


# Bumps the high watermark (locking the partition's row until commit), inserts the batch at the old
# one, and tells long-polling fetches on every server (NOTIFY is delivered at commit).
_APPEND_SQL = f"""
WITH head AS (
    UPDATE partitions SET high_watermark = high_watermark + $3
    WHERE topic_id = $1 AND partition = $2
    RETURNING high_watermark - $3 AS base_offset
), appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT $1, $2, base_offset, base_offset + $3 - 1, $4, $5, $6, $7, NULL, $8, $9, $3, $10, $11 FROM head
    RETURNING base_offset, last_offset
)
SELECT base_offset, last_offset, pg_notify('{APPENDS_CHANNEL}', $1::text || ':' || $2::text) FROM appended
"""


def check_appendable(append: BatchAppend) -> BrokerError | None:
    """The partition-level checks that need no database: partition exists, records fit."""
    topic = append.topic
    if not 0 <= append.partition < topic.partition_count:
        return unknown_partition(topic, append.partition)
    if append.batch.largest_record_bytes > topic.max_message_bytes:
        return BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a record of {append.batch.largest_record_bytes} bytes (key, value and headers) was sent "
            f"to {topic.name}-{append.partition}, whose max_message_bytes is {topic.max_message_bytes}: "
            f"send smaller records or create the topic with a larger max_message_bytes",
        )
    return None


async def append_batch(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult | BrokerError:
    """Appends one batch; the caller holds a PostgreSQL transaction and orders its appends. A batch
    of a producer (producer_id >= 0) is checked against the producer's sequence state first."""
    if append.producer_id == NO_PRODUCER_ID:
        return await _append_plain(conn, append)
    return (await append_batches(conn, [append]))[0]


async def _append_plain(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult:
    batch = append.batch
    row = await conn.fetchrow(
        _APPEND_SQL,
        append.topic.topic_id,
        append.partition,
        batch.record_count,
        append.producer_id,
        append.producer_epoch,
        append.base_sequence,
        append.is_transactional,
        batch.first_timestamp_ms,
        batch.max_timestamp_ms,
        batch.size_bytes,
        batch.payload,
    )
    if row is None:  # the topic was deleted since it was looked up
        raise unknown_partition(append.topic, append.partition)
    return AppendResult(row["base_offset"], row["last_offset"])


# Appends of a PostgreSQL transaction (one produce request, or a group of requests committed together,
# app/coordinator/write_groups.py) lock their partitions in one statement, in lock_order (the LockRows
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
_LOCK_HEADS_SQL = """
WITH locked AS MATERIALIZED (
    SELECT p.topic_id, p.partition, p.high_watermark
    FROM partitions p JOIN unnest($1::int[], $2::int[]) AS wanted(topic_id, partition)
      ON p.topic_id = wanted.topic_id AND p.partition = wanted.partition
    ORDER BY p.topic_id, p.partition
    FOR UPDATE OF p
)
SELECT topic_id, partition, high_watermark, NULL AS producer_id, NULL AS producer_epoch, NULL AS last_sequence,
       NULL AS recent_batches, NULL AS current_txn_first_offset, NULL::bigint AS marker_offset
FROM locked
UNION ALL
SELECT s.topic_id, s.partition, NULL, s.producer_id, s.producer_epoch, s.last_sequence, s.recent_batches,
       s.current_txn_first_offset, NULL
FROM producer_states s JOIN unnest($3::int[], $4::int[], $5::bigint[]) AS wanted(topic_id, partition, producer_id)
  ON s.topic_id = wanted.topic_id AND s.partition = wanted.partition AND s.producer_id = wanted.producer_id
UNION ALL
SELECT m.topic_id, m.partition, NULL, m.producer_id, m.producer_epoch, NULL, NULL, NULL, m.marker_offset
FROM txn_markers m
JOIN unnest($6::int[], $7::int[], $8::bigint[], $9::int[]) AS wanted(topic_id, partition, producer_id, producer_epoch)
  ON m.topic_id = wanted.topic_id AND m.partition = wanted.partition AND m.producer_id = wanted.producer_id
     AND m.producer_epoch = wanted.producer_epoch
"""

# Then, with every lock held, a fresh statement (a fresh snapshot) reads the other producers'
# states: nothing else serializes an idempotent producer's appends but the partition's lock, and a
# statement that waited for a row lock re-reads only the locked row, so a producer state joined in
# the locking statement could predate a concurrent append of that producer that committed while we
# waited (a retry racing its original would then be appended twice).
_PRODUCER_STATES_SQL = """
SELECT s.topic_id, s.partition, s.producer_id, s.producer_epoch, s.last_sequence, s.recent_batches,
       s.current_txn_first_offset
FROM producer_states s JOIN unnest($1::int[], $2::int[], $3::bigint[]) AS wanted(topic_id, partition, producer_id)
  ON s.topic_id = wanted.topic_id AND s.partition = wanted.partition AND s.producer_id = wanted.producer_id
"""

# Run with the partitions locked and their heads known: sets each partition's new high watermark
# (`h`, one row per partition), inserts every batch at the offsets computed under the locks (`b`,
# several per partition when several requests append to it together), upserts each producer's
# state after its last batch there (`st`, one row per partition and producer) and notifies long
# polls at commit. One round trip however many batches, partitions and producers (and whatever
# statement the caller fuses after it: fused_writes.py).
_WRITE_APPENDS_QUERIES = f"""h AS (
    SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[]) AS h(topic_id, partition, high_watermark)
), head AS (
    UPDATE partitions p SET high_watermark = h.high_watermark
    FROM h WHERE p.topic_id = h.topic_id AND p.partition = h.partition
), appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT b.topic_id, b.partition, b.base_offset, b.base_offset + b.record_count - 1, b.producer_id,
        b.producer_epoch, b.base_sequence, b.is_transactional, NULL, b.first_timestamp_ms, b.max_timestamp_ms,
        b.record_count, b.size_bytes, b.records
    FROM unnest($4::int[], $5::int[], $6::bigint[], $7::int[], $8::bigint[], $9::int[], $10::int[], $11::bool[],
                $12::bigint[], $13::bigint[], $14::int[], $15::bytea[])
        AS b(topic_id, partition, base_offset, record_count, producer_id, producer_epoch, base_sequence,
             is_transactional, first_timestamp_ms, max_timestamp_ms, size_bytes, records)
), state AS (
    INSERT INTO producer_states (topic_id, partition, producer_id, producer_epoch, last_sequence,
        last_timestamp_ms, last_append_ms, recent_batches, current_txn_first_offset)
    SELECT st.topic_id, st.partition, st.producer_id, st.producer_epoch, st.last_sequence, st.last_timestamp_ms,
        $24, st.recent_batches::jsonb, st.current_txn_first_offset
    FROM unnest($16::int[], $17::int[], $18::bigint[], $19::int[], $20::int[], $21::bigint[], $22::text[],
                $23::bigint[])
        AS st(topic_id, partition, producer_id, producer_epoch, last_sequence, last_timestamp_ms, recent_batches,
              current_txn_first_offset)
    ON CONFLICT (topic_id, partition, producer_id) DO UPDATE SET producer_epoch = EXCLUDED.producer_epoch,
        last_sequence = EXCLUDED.last_sequence, last_timestamp_ms = EXCLUDED.last_timestamp_ms,
        last_append_ms = EXCLUDED.last_append_ms, recent_batches = EXCLUDED.recent_batches,
        current_txn_first_offset = EXCLUDED.current_txn_first_offset
)"""
_WRITE_APPENDS_FINAL = f"SELECT pg_notify('{APPENDS_CHANNEL}', h.topic_id::text || ':' || h.partition::text) FROM h"


def _entry_from_row(row: asyncpg.Record) -> sequences.ProducerEntry:
    return sequences.ProducerEntry(
        row["producer_epoch"],
        row["last_sequence"],
        tuple(sequences.RecentBatch(*batch) for batch in row["recent_batches"]),
        row["current_txn_first_offset"],
    )


@dataclass(frozen=True, slots=True)
class _CheckedAppend:
    """A producer's batch that passed its sequence check, with where it goes and the producer's state after it."""

    append: BatchAppend
    base_offset: int
    state: sequences.ProducerEntry


async def _check_at_head(
    conn: asyncpg.Connection, append: BatchAppend, entry: sequences.ProducerEntry | None, head: int
) -> _CheckedAppend | AppendResult | BrokerError:
    """The producer's batch checked against its state: a duplicate's original offsets, an error, or
    the batch to write. `entry` is the producer's state on the partition and `head` its high
    watermark, as read under the partition's lock and advanced by the batches appended before this
    one in the same PostgreSQL transaction."""
    topic, batch = append.topic, append.batch
    if entry is None and append.base_sequence != 0 and not await _still_issued(conn, append.producer_id):
        # The producer's state and its id expired together (it was idle everywhere) between the
        # request's check of the id and this lock: answer as that check would now, which the
        # producer recovers from with a new id, instead of a fatal OUT_OF_ORDER_SEQUENCE_NUMBER.
        return BrokerError(
            ErrorCode.UNKNOWN_PRODUCER_ID,
            f"producer id {append.producer_id} has expired (it wrote nowhere for the server's "
            f"producer_id_expiration_ms): get a new one from POST /v1/producers/init",
        )
    outcome = sequences.check_batch(
        entry,
        append.producer_id,
        append.producer_epoch,
        append.base_sequence,
        batch.record_count,
        append.is_transactional,
        f"{topic.name}-{append.partition}",
    )
    if isinstance(outcome, BrokerError):
        return outcome
    if isinstance(outcome, sequences.Duplicate):
        return AppendResult(outcome.base_offset, outcome.last_offset, duplicate=True)
    base_offset = head
    updated = sequences.remember(
        entry,
        append.producer_epoch,
        append.base_sequence,
        outcome.last_sequence,
        base_offset,
        base_offset + batch.record_count - 1,
        append.is_transactional,
    )
    return _CheckedAppend(append, base_offset, updated)


@dataclass(frozen=True, slots=True)
class _Write:
    """A batch to write at `base_offset`; `state` is its producer's state after it (None for a plain batch)."""

    append: BatchAppend
    base_offset: int
    state: sequences.ProducerEntry | None = None


def _recent_batches_json(state: sequences.ProducerEntry) -> str:
    return orjson.dumps(
        [[r.base_sequence, r.last_sequence, r.base_offset, r.last_offset] for r in state.recent_batches]
    ).decode()


def _write_appends(writes: list[_Write], heads: dict[tuple[int, int], int]) -> WriteStatement:
    """The statement that writes checked batches (in the order they were given offsets) to their
    locked partitions, with each partition's new head and each producer's last state there."""
    touched = list(dict.fromkeys((w.append.topic.topic_id, w.append.partition) for w in writes))
    last_state: dict[tuple[int, int, int], _Write] = {}
    for write in writes:
        if write.state is not None:  # a later batch of the same producer and partition replaces it
            last_state[(write.append.topic.topic_id, write.append.partition, write.append.producer_id)] = write
    states = list(last_state.values())
    appends = [w.append for w in writes]
    args = (
        [topic_id for topic_id, _ in touched],
        [partition for _, partition in touched],
        [heads[key] for key in touched],
        [a.topic.topic_id for a in appends],
        [a.partition for a in appends],
        [w.base_offset for w in writes],
        [a.batch.record_count for a in appends],
        [a.producer_id for a in appends],
        [a.producer_epoch for a in appends],
        [a.base_sequence for a in appends],
        [a.is_transactional for a in appends],
        [a.batch.first_timestamp_ms for a in appends],
        [a.batch.max_timestamp_ms for a in appends],
        [a.batch.size_bytes for a in appends],
        [a.batch.payload for a in appends],
        [w.append.topic.topic_id for w in states],
        [w.append.partition for w in states],
        [w.append.producer_id for w in states],
        [w.state.producer_epoch for w in states],
        [w.state.last_sequence for w in states],
        [w.append.batch.max_timestamp_ms for w in states],
        [_recent_batches_json(w.state) for w in states],
        [w.state.current_txn_first_offset for w in states],
        now_ms(),
    )
    return WriteStatement(_WRITE_APPENDS_QUERIES, _WRITE_APPENDS_FINAL, args)


async def _still_issued(conn: asyncpg.Connection, producer_id: int) -> bool:
    # Expiry deletes an id in the PostgreSQL transaction that deletes its last state, so once the
    # state is seen gone, a gone id is seen too.
    return await conn.fetchval("SELECT 1 FROM producer_ids WHERE producer_id = $1", producer_id) is not None


# Kafka's AppendOrigin.COORDINATOR: a transactional batch the coordinator writes on the producer's
# behalf (its offset commits in __consumer_offsets). It carries the transaction's producer id and
# epoch, so read_committed readers hide it until the COMMIT marker (and forever after an ABORT), and
# it opens the producer's transaction on the partition (pinning the LSO) unless already open; there
# is no sequence to check (NO_SEQUENCE), the coordinator checked the producer. Run with the
# partition's row locked by the UPDATE of `head` (appends to the partition queue on it).
_APPEND_FOR_COORDINATOR_SQL = f"""
WITH head AS (
    UPDATE partitions SET high_watermark = high_watermark + $3
    WHERE topic_id = $1 AND partition = $2
    RETURNING high_watermark - $3 AS base_offset
), appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT $1, $2, base_offset, base_offset + $3 - 1, $4, $5, {NO_SEQUENCE}, true, NULL, $6, $7, $3, $8, $9 FROM head
    RETURNING base_offset, last_offset
), state AS (
    INSERT INTO producer_states (topic_id, partition, producer_id, producer_epoch, last_sequence,
        last_timestamp_ms, last_append_ms, recent_batches, current_txn_first_offset)
    SELECT $1, $2, $4, $5, {NO_SEQUENCE}, $7, $10, '[]'::jsonb, base_offset FROM head
    ON CONFLICT (topic_id, partition, producer_id) DO UPDATE SET producer_epoch = EXCLUDED.producer_epoch,
        last_timestamp_ms = EXCLUDED.last_timestamp_ms, last_append_ms = EXCLUDED.last_append_ms,
        current_txn_first_offset = coalesce(producer_states.current_txn_first_offset,
                                            EXCLUDED.current_txn_first_offset)
)
SELECT base_offset, last_offset, pg_notify('{APPENDS_CHANNEL}', $1::text || ':' || $2::text) FROM appended
"""


async def append_for_coordinator(
    conn: asyncpg.Connection,
    topic: TopicInfo,
    partition: int,
    batch: EncodedBatch,
    producer_id: int,
    producer_epoch: int,
) -> AppendResult:
    """Appends a batch of the transaction of (producer_id, producer_epoch) written by the coordinator
    itself; the caller holds the PostgreSQL transaction (and the transactional id's row)."""
    row = await conn.fetchrow(
        _APPEND_FOR_COORDINATOR_SQL,
        topic.topic_id,
        partition,
        batch.record_count,
        producer_id,
        producer_epoch,
        batch.first_timestamp_ms,
        batch.max_timestamp_ms,
        batch.size_bytes,
        batch.payload,
        now_ms(),
    )
    if row is None:
        raise unknown_partition(topic, partition)
    return AppendResult(row["base_offset"], row["last_offset"])


# The LSO is the first offset of the earliest open transaction (a probe of the partial index
# producer_states_open_transactions), read in the same snapshot as the high watermark.
_STATE_COLUMNS = """p.high_watermark, p.log_start_offset,
       (SELECT min(s.current_txn_first_offset) FROM producer_states s
        WHERE s.topic_id = p.topic_id AND s.partition = p.partition
          AND s.current_txn_first_offset IS NOT NULL) AS first_open_offset"""
_STATE_SQL = f"""
SELECT p.topic_id, {_STATE_COLUMNS}
FROM partitions p
"""

# A fetch's first statement: the topics of its positions and each position's partition state, one
# round trip instead of two. A position whose topic does not exist has no row; one whose partition
# does not exist has a row with a NULL high watermark.
_TOPIC_COLUMNS_OF_T = ", ".join("t." + column for column in TOPIC_COLUMNS.split(", "))
_TOPICS_AND_STATES_SQL = f"""
SELECT {_TOPIC_COLUMNS_OF_T}, w.partition AS wanted_partition,
       {_STATE_COLUMNS}
FROM unnest($1::text[], $2::int[]) AS w(name, partition)
JOIN topics t ON t.name = w.name
LEFT JOIN partitions p ON p.topic_id = t.topic_id AND p.partition = w.partition
"""


def _state_from_row(row: asyncpg.Record) -> PartitionState:
    first_open = row["first_open_offset"]
    return PartitionState(
        row["high_watermark"], row["log_start_offset"], row["high_watermark"] if first_open is None else first_open
    )


async def partition_state(conn: asyncpg.Connection, topic: TopicInfo, partition: int) -> PartitionState:
    if not 0 <= partition < topic.partition_count:
        raise unknown_partition(topic, partition)
    row = await conn.fetchrow(_STATE_SQL + "WHERE p.topic_id = $1 AND p.partition = $2", topic.topic_id, partition)
    if row is None:
        raise unknown_partition(topic, partition)
    return _state_from_row(row)


async def partition_states(conn: asyncpg.Connection, topics: list[TopicInfo]) -> dict[int, list[PartitionState]]:
    """The states of every partition of these topics, by topic_id, in one query."""
    rows = await conn.fetch(
        _STATE_SQL + "WHERE p.topic_id = ANY($1::int[]) ORDER BY p.topic_id, p.partition",
        [topic.topic_id for topic in topics],
    )
    states: dict[int, list[PartitionState]] = {topic.topic_id: [] for topic in topics}
    for row in rows:
        states[row["topic_id"]].append(_state_from_row(row))
    return states


async def topics_and_states(
    conn: asyncpg.Connection, positions: list[tuple[str, int]]
) -> tuple[dict[str, TopicInfo], dict[tuple[str, int], PartitionState]]:
    """The topics named by these (topic name, partition) positions, by name, and the state of each
    position's partition that exists, in one statement (one snapshot)."""
    wanted = [(name, partition) for name, partition in positions if could_exist(name)]
    rows = await conn.fetch(
        _TOPICS_AND_STATES_SQL, [name for name, _ in wanted], [partition for _, partition in wanted]
    )
    topics: dict[str, TopicInfo] = {}
    states: dict[tuple[str, int], PartitionState] = {}
    for row in rows:
        topics[row["name"]] = topic_from_row(row)
        if row["high_watermark"] is not None:
            states[(row["name"], row["wanted_partition"])] = _state_from_row(row)
    return topics, states


def _offset_out_of_range(topic: TopicInfo, partition: int, offset: int, state: PartitionState) -> BrokerError:
    return BrokerError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"offset {offset} is outside {topic.name}-{partition}: expected {state.log_start_offset} "
        f"(log_start_offset) to {state.high_watermark} (high_watermark); reset to one of them "
        f"(POST /v1/offsets/list)",
    )


# Whether the data batch `b` (a record_batches row of partition ($1, $2)) belongs to an aborted
# transaction. Its transaction is the one ended by the first marker of its producer after it: a
# producer's transactions follow one another, and with transaction version 1 its epoch carries over
# from one transaction to the next, so (producer id, epoch) may name several of them while the
# marker's offset names one. One probe of txn_markers_by_producer. False while the transaction is
# open (no marker yet: it is above the LSO, where read_committed stops).
ABORTED_BATCH_SQL = f"""(b.is_transactional AND b.control_type IS NULL AND coalesce((
    SELECT m.control_type = {CONTROL_ABORT} FROM txn_markers m
    WHERE m.topic_id = $1 AND m.partition = $2 AND m.producer_id = b.producer_id AND m.marker_offset > b.last_offset
    ORDER BY m.marker_offset LIMIT 1), false))"""


# Reads one page of a partition's batches in log order: those ending in [$3, $6), the window, then
# the first one ending at or after $6 (a batch that straddles the window's end, or the next after a
# gap compaction left), all below $4 (the reader's upper bound); at most $5 (page_size) + 1 rows, both
# parts walking the primary key from a probe, never to the partition's end. With $8 (read_committed),
# each transactional batch's marker decides whether it is aborted (ABORTED_BATCH_SQL). Payloads
# are stored out of line (a TOAST read each), so a row carries its payload only when the read surely
# uses it: a data batch, not aborted, starting below $7 (the read's offset plus the records still
# wanted: every record before it is one the read returns or a skipped one).
#
# A page is one statement, so what it says of a batch (its header, whether it is aborted, its records)
# comes from one snapshot, and a read needs none across statements: below the upper bound read with
# the partition's state, batches are never appended to or un-aborted; the log cleaner removes a
# transaction's marker no earlier than its batches (log_cleaner.py's rules), and whatever it removes
# between two pages is simply not returned.
_PAGE_BATCHES = (
    "SELECT base_offset, last_offset, control_type, producer_id, producer_epoch, is_transactional, records "
    "FROM record_batches"
)
_PAGE_SQL = f"""
SELECT b.base_offset, b.last_offset, b.control_type, b.producer_id, b.producer_epoch, b.is_transactional, a.aborted,
       CASE WHEN b.control_type IS NULL AND NOT a.aborted AND b.base_offset < $7 THEN b.records END AS records
FROM (
    ({_PAGE_BATCHES}
     WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $6 AND base_offset < $4
     ORDER BY last_offset LIMIT $5)
    UNION ALL
    (SELECT * FROM ({_PAGE_BATCHES}
                    WHERE topic_id = $1 AND partition = $2 AND last_offset >= greatest($3, $6)
                    ORDER BY last_offset LIMIT 1) AS window_end
     WHERE base_offset < $4)
) AS b
CROSS JOIN LATERAL (
    SELECT $8::bool AND {ABORTED_BATCH_SQL}
    OFFSET 0  -- evaluated once per batch: pulled up, the probe ran for each of its two uses
) AS a(aborted)
ORDER BY b.last_offset
"""

# The most offsets one page's window covers, however many were skipped before it.
MAX_WINDOW_OFFSETS = 1_000_000


async def read(
    conn: asyncpg.Connection,
    topic: TopicInfo,
    partition: int,
    offset: int,
    max_records: int,
    isolation_level: str,
    encoding: str,
    state: PartitionState | None = None,
) -> ReadResult:
    """Up to max_records records from `offset`; `state`: the partition's, when the caller has read it
    (topics_and_states). Needs no snapshot across its statements (see _PAGE_SQL)."""
    if state is None:
        state = await partition_state(conn, topic, partition)
    if not state.log_start_offset <= offset <= state.high_watermark:
        raise _offset_out_of_range(topic, partition, offset, state)
    upper = state.upper_bound(isolation_level)
    if offset >= upper or max_records <= 0:  # a spent budget still reports the watermarks
        return ReadResult(state, [], offset)
    records: list[dict] = []
    next_offset = offset
    scanned = 0
    window = max_records  # offsets a page covers: every record wanted, when nothing is skipped
    # Markers and aborted batches are skipped, so keep reading pages of batches until the records
    # are enough, the upper bound is reached, or MAX_BATCHES_SCANNED bounds the request's cost (the
    # caller then continues from next_offset).
    while len(records) < max_records and next_offset < upper and scanned < MAX_BATCHES_SCANNED:
        wanted_records = max_records - len(records)
        page_size = min(wanted_records, MAX_BATCHES_SCANNED - scanned) + 16
        headers = await conn.fetch(
            _PAGE_SQL,
            topic.topic_id,
            partition,
            next_offset,
            upper,
            page_size,
            next_offset + window,
            next_offset + wanted_records,
            isolation_level == READ_COMMITTED,
        )
        # More rows than page_size only when the first part filled its LIMIT and the window's last
        # batch came too: it is not contiguous with the rest, so it waits for the next page.
        del headers[page_size:]
        if not headers:
            break
        scanned += len(headers)
        wanted: list[tuple[asyncpg.Record, int, int]] = []  # (header, first index, stop index)
        position, budget = next_offset, wanted_records
        for header in headers:
            if header["control_type"] is not None or header["aborted"]:
                position = header["last_offset"] + 1
                continue
            start = max(position - header["base_offset"], 0)
            stop = min(header["last_offset"] - header["base_offset"] + 1, start + budget)
            wanted.append((header, start, stop))
            budget -= stop - start
            position = header["base_offset"] + stop
            if budget <= 0:
                break
        # A batch the page did not carry the payload of: one that starts past the records wanted
        # because skipped batches (markers, aborted ones) came first.
        missing = [header["last_offset"] for header, _, _ in wanted if header["records"] is None]
        payloads = await _payloads(conn, topic, partition, missing)
        for header, start, stop in wanted:
            payload = header["records"]
            if payload is None:
                payload = payloads.get(header["last_offset"])
            if payload is None:
                # Removed since its header was read (a page is one snapshot, the read is several): by
                # the log cleaner (below the log start, or compacted away whole) or with its topic.
                # Nothing of it is to be returned.
                continue
            records += record_codec.render_records(
                record_codec.decode_payload(payload), header["base_offset"], start, stop, encoding
            )
        next_offset = position
        if budget > 0:  # skipped records (markers, aborted batches, compaction's holes): look further next time
            window = min(window * 8, MAX_WINDOW_OFFSETS)
    return ReadResult(state, records, next_offset)


async def _payloads(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, last_offsets: list[int]
) -> dict[int, bytes]:
    if not last_offsets:
        return {}
    rows = await conn.fetch(
        "SELECT last_offset, records FROM record_batches WHERE topic_id = $1 AND partition = $2 "
        "AND last_offset = ANY($3::bigint[])",
        topic.topic_id,
        partition,
        last_offsets,
    )
    return {row["last_offset"]: row["records"] for row in rows}


async def aborted_among(
    conn: asyncpg.Connection, topic_id: int, partition: int, batches: list[asyncpg.Record]
) -> set[int]:
    """The last offsets of the batches, among these, that belong to aborted transactions (rows with
    last_offset, producer_id, is_transactional and control_type): each found as ABORTED_BATCH_SQL does,
    so the cost depends on the batches read, never on the length of the log. Used by compaction,
    which drops aborted batches (read_committed reads check in _PAGE_SQL itself)."""
    candidates = [b for b in batches if b["is_transactional"] and b["control_type"] is None]
    if not candidates:
        return set()
    rows = await conn.fetch(
        "SELECT b.last_offset FROM unnest($3::bigint[], $4::bigint[]) AS c(last_offset, producer_id) "
        "CROSS JOIN LATERAL (SELECT c.last_offset, c.producer_id, true AS is_transactional, "
        "NULL::smallint AS control_type) AS b "
        f"WHERE {ABORTED_BATCH_SQL}",
        topic_id,
        partition,
        [b["last_offset"] for b in candidates],
        [b["producer_id"] for b in candidates],
    )
    return {row["last_offset"] for row in rows}


async def offset_for(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, timestamp: int, isolation_level: str
) -> tuple[int, int]:
    """ListOffsets: (offset, timestamp_ms) for latest (-1), earliest (-2) or a time in ms."""
    state = await partition_state(conn, topic, partition)
    upper = state.upper_bound(isolation_level)
    if timestamp == LATEST_TIMESTAMP:
        return upper, NO_TIMESTAMP
    if timestamp == EARLIEST_TIMESTAMP:
        return state.log_start_offset, NO_TIMESTAMP
    # Batches are not ordered by time, so walk them in log order to the first that reaches it. The
    # first batch may begin below the log start (DeleteRecords moves it inside a batch): its records
    # below it do not count, and if only those reach the time, the next batch is the answer.
    after = state.log_start_offset
    while True:
        batch = await conn.fetchrow(
            "SELECT base_offset, last_offset, records FROM record_batches WHERE topic_id = $1 AND partition = $2 "
            "AND control_type IS NULL AND max_timestamp_ms >= $3 AND base_offset < $4 "
            "AND last_offset >= $5 ORDER BY last_offset LIMIT 1",
            topic.topic_id,
            partition,
            timestamp,
            upper,
            after,
        )
        if batch is None:
            return NO_OFFSET, NO_TIMESTAMP
        for index, stored in enumerate(record_codec.decode_payload(batch["records"])):
            offset = batch["base_offset"] + index
            # None: a record compaction removed.
            if stored is not None and stored[0] >= timestamp and state.log_start_offset <= offset < upper:
                return offset, stored[0]
        after = batch["last_offset"] + 1


@dataclass(slots=True)
class LockedPartitions:
    """What lock_partitions read under the locks: each partition's high watermark (`heads`), the
    state of each producer asked for (`states`, by (topic_id, partition, producer_id)) and the
    offset of each marker asked for that exists (`markers`, by (topic_id, partition, producer_id,
    producer_epoch)). Planning advances `heads` and `states` past what it plans to write, so that
    what is planned next in the same PostgreSQL transaction follows it."""

    heads: dict[tuple[int, int], int]
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
        return LockedPartitions({}, {}, {})
    wanted = sorted(locks.partitions, key=_lock_key)
    producers, markers = sorted(locks.producers), sorted(locks.markers)
    rows = await conn.fetch(
        _LOCK_HEADS_SQL,
        [t for t, _ in wanted],
        [p for _, p in wanted],
        *(list(column) for column in zip(*producers)) if producers else ([], [], []),
        *(list(column) for column in zip(*markers)) if markers else ([], [], [], []),
    )
    locked = LockedPartitions({}, {}, {})
    for row in rows:
        if row["producer_id"] is None:
            locked.heads[(row["topic_id"], row["partition"])] = row["high_watermark"]
        elif row["marker_offset"] is None:
            locked.states[(row["topic_id"], row["partition"], row["producer_id"])] = _entry_from_row(row)
        else:
            key = (row["topic_id"], row["partition"], row["producer_id"], row["producer_epoch"])
            locked.markers[key] = row["marker_offset"]
    return locked


@dataclass(slots=True)
class AppendPlan:
    """Appends checked against their locked partitions (`plan_appends`): each one's partition-level
    error or duplicate's answer, and the statement that writes the others (None if none is to be
    written). `results()` once that statement ran."""

    _results: list[AppendResult | BrokerError | None]
    _writes: dict[int, _Write]
    statement: WriteStatement | None

    @property
    def written_partitions(self) -> set[tuple[int, int]]:
        return {(w.append.topic.topic_id, w.append.partition) for w in self._writes.values()}

    def results(self) -> list[AppendResult | BrokerError]:
        results = list(self._results)
        for index, write in self._writes.items():
            results[index] = AppendResult(write.base_offset, write.base_offset + write.append.batch.record_count - 1)
        return results


def locks_for_appends(appends: list[BatchAppend]) -> PartitionLocks:
    """What plan_appends needs locked: the appends' partitions and their transactional producers' states."""
    appendable = [a for a in appends if check_appendable(a) is None]
    return PartitionLocks(
        frozenset((a.topic.topic_id, a.partition) for a in appendable),
        frozenset((a.topic.topic_id, a.partition, a.producer_id) for a in appendable if a.is_transactional),
    )


async def plan_appends(conn: asyncpg.Connection, appends: list[BatchAppend], locked: LockedPartitions) -> AppendPlan:
    """Checks the appends in the given order, as if appended one after the other, against their
    partitions locked by lock_partitions (`locks_for_appends` or more), and advances `locked` past
    them. Reads the states of idempotent producers among them (a statement of its own, now that the
    locks are held)."""
    results: list[AppendResult | BrokerError | None] = [check_appendable(append) for append in appends]
    heads, entries = locked.heads, locked.states
    producers = sorted(
        {
            (a.topic.topic_id, a.partition, a.producer_id)
            for a, result in zip(appends, results)
            if result is None
            and a.producer_id != NO_PRODUCER_ID
            and not a.is_transactional
            and (a.topic.topic_id, a.partition) in heads
        }
    )
    if producers:
        rows = await conn.fetch(
            _PRODUCER_STATES_SQL, [k[0] for k in producers], [k[1] for k in producers], [k[2] for k in producers]
        )
        entries.update({(row["topic_id"], row["partition"], row["producer_id"]): _entry_from_row(row) for row in rows})
    writes: dict[int, _Write] = {}
    for index, append in enumerate(appends):
        if results[index] is not None:
            continue
        key = (append.topic.topic_id, append.partition)
        head = heads.get(key)
        if head is None:  # its topic was deleted since it was looked up
            results[index] = unknown_partition(append.topic, append.partition)
            continue
        if append.producer_id == NO_PRODUCER_ID:
            writes[index] = _Write(append, head)
        else:
            producer_key = (*key, append.producer_id)
            try:
                outcome = await _check_at_head(conn, append, entries.get(producer_key), head)
            except BrokerError as error:
                results[index] = error
                continue
            if not isinstance(outcome, _CheckedAppend):
                results[index] = outcome
                continue
            entries[producer_key] = outcome.state
            writes[index] = _Write(append, head, outcome.state)
        heads[key] = head + append.batch.record_count
    statement = _write_appends(list(writes.values()), heads) if writes else None
    return AppendPlan(results, writes, statement)


async def append_batches(
    conn: asyncpg.Connection, appends: list[BatchAppend], then: WriteStatement | None = None
) -> list[AppendResult | BrokerError]:
    """Appends batches of any producers (plain ones included), several to one partition if need be:
    each entry's result or partition-level error, in the given order, as if appended one after the
    other. The caller holds the PostgreSQL transaction, so nothing is visible before all are durable,
    and, for every transactional append, has held its transactional id's row (TransactionLog.lock,
    lock_many_and_find_topics) since an earlier statement (see _LOCK_HEADS_SQL). Two statements whatever their
    number: lock every partition (lock_order) and read its head and the transactional producers'
    states there, write everything; a third reads the states of idempotent producers, if any, once
    the locks are held. `then`: a statement of the caller's to run last, fused with the write (or
    alone when nothing is written)."""
    if then is None and len(appends) == 1 and appends[0].producer_id == NO_PRODUCER_ID:
        if (refused := check_appendable(appends[0])) is not None:
            return [refused]
        try:  # one statement locks, reads and bumps the head (and may run without a transaction)
            return [await _append_plain(conn, appends[0])]
        except BrokerError as error:
            return [error]
    plan = await plan_appends(conn, appends, await lock_partitions(conn, locks_for_appends(appends)))
    await execute_fused(conn, plan.statement, then)
    return plan.results()


def _lock_key(key: tuple[int, int]) -> tuple[int, int]:
    return lock_order(*key)


def lock_order(topic_id: int, partition: int) -> tuple[int, int]:
    """Everyone who locks several partitions (produce, markers) locks them in this order, so no two
    PostgreSQL transactions can deadlock on partition rows."""
    return topic_id, partition
