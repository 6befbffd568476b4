"""The partition log: what its parts share (a batch row's columns, the appends' channel, a
partition's state) and its reads: batches back in offset order, offsets found by time. Appends:
append.py; the partitions' row locks: locks.py.

Invariant: a reader sees a batch exactly when it sees the high watermark that covers it (same
PostgreSQL transaction), and bounds every read by the watermark it read first, so it never sees a
hole.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.log import record_codec
from app.storage.log.topics import TOPIC_COLUMNS, TopicInfo, could_exist, topic_from_row, unknown_partition

# The contract's sentinels and control record types (txbroker/wire.py, shared with the SDK), also
# imported from here by the rest of the server.
from txbroker.wire import (
    CONTROL_ABORT,
    CONTROL_COMMIT,  # noqa: F401 (the markers' and the coordinator's, imported from here)
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_OFFSET,
    NO_TIMESTAMP,
    READ_COMMITTED,
)

APPENDS_CHANNEL = "txbroker_appends"
# Kafka's ListOffsets "max timestamp" (KIP-734, ListOffsets v7): the record with the greatest
# timestamp. The Kafka door's only: HTTP's contract has the two sentinels above.
MAX_TIMESTAMP = -3

# The columns of a record_batches row, in the order every INSERT of a batch lists them (plain,
# idempotent and transactional batches, markers' control batches, the transaction log's records).
BATCH_COLUMNS = (
    "topic_id, partition, base_offset, last_offset, producer_id, producer_epoch, base_sequence, is_transactional, "
    "control_type, first_timestamp_ms, max_timestamp_ms, record_count, size_bytes, records"
)

# A marker as Kafka's Fetch sends it: the control batch of one record Kafka writes (61 bytes of
# batch header, then the record with its 4-byte key, version and type, and 6-byte value, version and
# coordinator epoch), whatever its offset, producer or timestamp (app/kafka/record_batches.py builds it).
MARKER_BATCH_BYTES = 78


# The bytes of a record_batches row as Kafka counts a batch in its log: a data batch its size_bytes,
# a marker its control batch (MARKER_BATCH_BYTES; the row stores no records, size_bytes 0). The one
# measure of Fetch's min_bytes and max_bytes (batch_reads.py), retention by size and a partition's
# stored bytes (log_cleaner.py), as Kafka counts a control batch toward each like any batch of the
# log. A constant, as every SQL fragment interpolated (tests/unit/test_sql_safety.py), so its columns
# are unqualified: it serves where record_batches, or a subquery of its columns, is the one relation
# of the query level with those names.
BATCH_BYTES_SQL = f"(CASE WHEN control_type IS NULL THEN size_bytes ELSE {MARKER_BATCH_BYTES} END)"


# The most batches one partition read looks at: bounds a fetch's cost when a long run of aborted
# batches or markers returns nothing.
MAX_BATCHES_SCANNED = 20_000
# `read`'s byte budget when its caller sets none: more than any page can hold.
MAX_READ_BYTES = 2**62


def notification_key(topic_id: int, partition: int) -> str:
    return f"{topic_id}:{partition}"


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int

    def upper_bound(self, isolation_level: str) -> int:
        """The first offset a reader at this isolation level may not see."""
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark

    def no_further_than(self, offset: int) -> PartitionState:
        """This state as told to a reader at `offset` when what it read past there is not confirmed
        by the synchronous standby (replication_barrier.py): the watermarks of a reader caught up."""
        return PartitionState(
            min(self.high_watermark, offset), min(self.log_start_offset, offset), min(self.last_stable_offset, offset)
        )


@dataclass(slots=True)
class ReadResult:
    state: PartitionState
    records: list[dict]
    next_offset: int
    size_bytes: int = 0  # the stored bytes of the batches its records came from (`read`'s max_bytes)


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
    "SELECT base_offset, last_offset, control_type, producer_id, producer_epoch, is_transactional, size_bytes, "
    "records FROM record_batches"
)

# $9: the bytes the page may carry payloads of (`read`'s max_bytes): a payload comes only while the
# data batches before it in the page (aborted ones too, conservatively) hold fewer bytes, so that a
# page of large batches never carries more than that and one batch. One withheld that `read` still
# wants (the aborted ones counted here, not there) is fetched by _payloads, within `read`'s budget.
_PAGE_SQL = f"""
SELECT b.base_offset, b.last_offset, b.control_type, b.producer_id, b.producer_epoch, b.is_transactional, a.aborted,
       b.size_bytes,
       CASE WHEN b.control_type IS NULL AND NOT a.aborted AND b.base_offset < $7
                 AND coalesce(sum(b.size_bytes) FILTER (WHERE b.control_type IS NULL)
                              OVER (ORDER BY b.last_offset ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < $9
            THEN b.records END AS records
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
    max_bytes: int = MAX_READ_BYTES,
    at_least_one_batch: bool = True,
) -> ReadResult:
    """Up to max_records records from `offset`, from batches of at most `max_bytes` stored bytes in
    all, as Kafka's fetch.max.bytes bounds an answer (KIP-74): the first batch is read whatever its
    size when `at_least_one_batch`, so that a batch larger than the budget never stalls a consumer;
    `state`: the partition's, when the caller has read it (topics_and_states). Needs no snapshot
    across its statements (see _PAGE_SQL)."""
    if state is None:
        state = await partition_state(conn, topic, partition)
    if not state.log_start_offset <= offset <= state.high_watermark:
        raise _offset_out_of_range(topic, partition, offset, state)
    upper = state.upper_bound(isolation_level)
    if offset >= upper or max_records <= 0 or (max_bytes <= 0 and not at_least_one_batch):
        return ReadResult(state, [], offset)  # a spent budget still reports the watermarks
    records: list[dict] = []
    next_offset = offset
    scanned = 0
    read_bytes = 0
    bytes_spent = False
    window = max_records  # offsets a page covers: every record wanted, when nothing is skipped
    # Markers and aborted batches are skipped, so keep reading pages of batches until the records
    # are enough, the upper bound is reached, or MAX_BATCHES_SCANNED bounds the request's cost (the
    # caller then continues from next_offset).
    while len(records) < max_records and next_offset < upper and scanned < MAX_BATCHES_SCANNED and not bytes_spent:
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
            max(max_bytes - read_bytes, 1),
        )
        # More rows than page_size only when the first part filled its LIMIT and the window's last
        # batch came too: it is not contiguous with the rest, so it waits for the next page.
        del headers[page_size:]
        if not headers:
            next_offset = await _past_emptied_range(conn, topic, partition, next_offset, upper)
            break
        scanned += len(headers)
        wanted: list[tuple[asyncpg.Record, int, int]] = []  # (header, first index, stop index)
        position, budget = next_offset, wanted_records
        for header in headers:
            if header["control_type"] is not None or header["aborted"]:
                position = header["last_offset"] + 1
                continue
            if read_bytes + header["size_bytes"] > max_bytes and (read_bytes or records or not at_least_one_batch):
                bytes_spent = True  # this batch is the next answer's
                break
            read_bytes += header["size_bytes"]
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
                record_codec.decode_payload(payload, header["base_offset"]),
                header["base_offset"],
                start,
                stop,
                encoding,
            )
        next_offset = position
        if (
            budget > 0 and not bytes_spent
        ):  # skipped records (markers, aborted batches, compaction's holes): look further next time
            window = min(window * 8, MAX_WINDOW_OFFSETS)
    return ReadResult(state, records, next_offset, read_bytes)


async def _past_emptied_range(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, offset: int, upper: int
) -> int:
    """Where a read goes on from `offset` when no batch is left below its upper bound: at the bound.
    Compaction removed those batches whole (all of them before an open transaction, under
    read_committed; it keeps the log's last batch, as Kafka's cleaner keeps the active segment, but
    one compacted before it did may have left an empty tail), and offsets never change, so nothing
    can appear there again: staying put would leave a reader short of the bound for good (a Spark
    range planned up to it would never end; a consumer's lag would never reach 0). The read stays
    at `offset` when the log start moved past it since the read began (DeleteRecords or retention:
    their batches go after the log start moves, so the emptied range may be theirs), for the next read
    to answer OFFSET_OUT_OF_RANGE: a reader must learn that it missed records, not skip them."""
    row = await conn.fetchrow(_STATE_SQL + "WHERE p.topic_id = $1 AND p.partition = $2", topic.topic_id, partition)
    if row is None or offset < row["log_start_offset"]:
        return offset  # the topic is gone, or records were deleted: the next read says so
    return upper


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


async def _max_timestamp(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, lower: int, upper: int
) -> tuple[int, int]:
    """(offset, timestamp_ms) of the record with the greatest timestamp among offsets lower to upper
    (exclusive), the first such in log order, as Kafka answers KIP-734's max timestamp; (-1, -1)
    when there is none. Batches are read by their greatest timestamp, highest first: a batch reaching
    below `lower` or up to `upper` may hold its greatest one outside them, so the walk goes on while
    a batch could still hold a greater timestamp, or an equal one at an earlier offset."""
    best_offset, best_timestamp = NO_OFFSET, NO_TIMESTAMP
    rows = await conn.fetch(
        "SELECT base_offset, last_offset, max_timestamp_ms FROM record_batches WHERE topic_id = $1 "
        "AND partition = $2 AND control_type IS NULL AND base_offset < $3 AND last_offset >= $4 "
        "ORDER BY max_timestamp_ms DESC, last_offset",
        topic.topic_id,
        partition,
        upper,
        lower,
    )
    for row in rows:
        if best_offset != NO_OFFSET and (
            row["max_timestamp_ms"] < best_timestamp
            or (row["max_timestamp_ms"] == best_timestamp and row["base_offset"] > best_offset)
        ):
            break
        records = await conn.fetchval(
            "SELECT records FROM record_batches WHERE topic_id = $1 AND partition = $2 AND last_offset = $3",
            topic.topic_id,
            partition,
            row["last_offset"],
        )
        if records is None:  # removed since it was listed (the cleaner: below the log start, compaction)
            continue
        for index, stored in enumerate(record_codec.decode_payload(records, row["base_offset"])):
            offset = row["base_offset"] + index
            if stored is None or not lower <= offset < upper:  # None: a record compaction removed
                continue
            if stored[0] > best_timestamp or (stored[0] == best_timestamp and offset < best_offset):
                best_offset, best_timestamp = offset, stored[0]
    return best_offset, best_timestamp


async def offset_for(
    conn: asyncpg.Connection, topic: TopicInfo, partition: int, timestamp: int, isolation_level: str
) -> tuple[int, int]:
    """ListOffsets: (offset, timestamp_ms) for latest (-1), earliest (-2), max timestamp (-3) or a
    time in ms."""
    state = await partition_state(conn, topic, partition)
    upper = state.upper_bound(isolation_level)
    if timestamp == LATEST_TIMESTAMP:
        return upper, NO_TIMESTAMP
    if timestamp == EARLIEST_TIMESTAMP:
        return state.log_start_offset, NO_TIMESTAMP
    if timestamp == MAX_TIMESTAMP:
        # The whole log's greatest, answered only below what the reader may see, as Kafka's broker
        # (ReplicaManager.fetchOffset): under read_committed, a record at or past the LSO is no
        # answer, and none below it is looked for instead.
        offset, found_ms = await _max_timestamp(conn, topic, partition, state.log_start_offset, state.high_watermark)
        return (offset, found_ms) if offset < upper else (NO_OFFSET, NO_TIMESTAMP)
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
        for index, stored in enumerate(record_codec.decode_payload(batch["records"], batch["base_offset"])):
            offset = batch["base_offset"] + index
            # None: a record compaction removed.
            if stored is not None and stored[0] >= timestamp and state.log_start_offset <= offset < upper:
                return offset, stored[0]
        after = batch["last_offset"] + 1
