"""Browsing one partition's log for the console: a window of offsets with each record's
transactional status (plain, open, committed, aborted; markers as control records), the producers
with state on the partition, and its markers.

Read-only. A window is a primary-key range of `record_batches`; the status of a transactional batch
is the first marker of its producer at or after it (its own, for a control batch), one probe of
`txn_markers_by_producer`: with transaction version 1 several transactions share (producer id,
epoch), so only the marker's offset names one (partition_log.ABORTED_BATCH_SQL's rule).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import asyncpg

from app.storage.log import record_codec
from app.storage.log.markers import CONTROL_TYPE_NAMES
from app.storage.log.partition_log import CONTROL_ABORT, CONTROL_COMMIT
from app.storage.rows import all_from_rows, from_row

PLAIN = "plain"  # not transactional: visible to read_committed once below the LSO
OPEN = "open"  # transactional, no marker yet: holds the LSO
COMMITTED = "committed"
ABORTED = "aborted"  # never returned to read_committed readers
MARKER = "marker"  # a control record (COMMIT or ABORT); never returned by fetch

_STATUS_OF_MARKER = {CONTROL_COMMIT: COMMITTED, CONTROL_ABORT: ABORTED}


@dataclass(frozen=True, slots=True)
class LogEntry:
    offset: int
    timestamp_ms: int
    key: str | None
    value: str | None
    headers: list[tuple[str, str | None, bool]]  # (key, value, whether the value is shown base64)
    # Whether the key, the value is shown base64: its bytes are not UTF-8. A record stored base64
    # (one of its fields is not UTF-8) has each field that is shown as the text it is.
    key_base64: bool
    value_base64: bool
    producer_id: int
    producer_epoch: int
    sequence: int | None  # the record's sequence number (idempotent producers), None otherwise
    is_transactional: bool
    status: str
    control: str | None  # "COMMIT" or "ABORT" for a marker
    decided_at: int | None  # the offset of the marker that decided this transactional record
    first_offset: int | None  # for a marker: the first offset of the transaction it ends here


# The batches overlapping [start, end), each with the marker of its transaction if there is one
# (for a control batch, its own row in txn_markers): those ending inside the window, and the first one
# ending after it if it begins inside. Both are ranges of the primary key (last_offset): bounding the
# batches by `base_offset < end` alone would be a filter on every batch after the window.
_WINDOW_SQL = """
SELECT b.base_offset, b.last_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.is_transactional,
       b.control_type, b.first_timestamp_ms, b.records, m.control_type AS decided_by, m.marker_offset, m.first_offset
FROM (
    (SELECT * FROM record_batches WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 AND last_offset < $4)
    UNION ALL
    (SELECT * FROM record_batches WHERE topic_id = $1 AND partition = $2 AND last_offset >= $4
     ORDER BY last_offset LIMIT 1)
) b
LEFT JOIN LATERAL (
    SELECT control_type, marker_offset, first_offset FROM txn_markers
    WHERE b.is_transactional AND topic_id = b.topic_id AND partition = b.partition AND producer_id = b.producer_id
      AND marker_offset >= b.last_offset
    ORDER BY marker_offset LIMIT 1
) m ON true
WHERE b.base_offset < $4
ORDER BY b.last_offset
"""

# The offsets of the `count` batches from `start` on, or before `before`, without their records.
_BATCHES_FROM_SQL = """
SELECT base_offset, last_offset FROM record_batches
WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 ORDER BY last_offset LIMIT $4
"""
_BATCHES_BEFORE_SQL = """
(SELECT base_offset, last_offset FROM record_batches
 WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 ORDER BY last_offset LIMIT 1)
UNION ALL
(SELECT base_offset, last_offset FROM record_batches
 WHERE topic_id = $1 AND partition = $2 AND last_offset < $3 ORDER BY last_offset DESC LIMIT $4)
"""


async def window_end(
    conn: asyncpg.Connection, topic_id: int, partition: int, start: int, count: int, end_of_log: int
) -> int:
    """The end of the window that holds the `count` offsets stored from `start` on (the high
    watermark `end_of_log` if fewer are): where the cleaner removed whole batches, the window reaches
    past the gap, so a page shows the records there are, not offsets that are empty. Offsets inside
    a stored batch count whether or not compaction emptied them."""
    held = 0
    for batch in await conn.fetch(_BATCHES_FROM_SQL, topic_id, partition, start, count):
        first = max(batch["base_offset"], start)
        if held + batch["last_offset"] - first + 1 >= count:
            return min(first + count - held, end_of_log)
        held += batch["last_offset"] - first + 1
    return end_of_log


async def window_start_before(
    conn: asyncpg.Connection, topic_id: int, partition: int, before: int, count: int, start_of_log: int
) -> int:
    """The start of the window that holds the `count` offsets stored before `before` (the log start
    `start_of_log` if fewer are): "Older" and the tail's window, counted as `window_end` counts."""
    held = 0
    batches = await conn.fetch(_BATCHES_BEFORE_SQL, topic_id, partition, before, count)
    for batch in sorted(batches, key=lambda b: b["last_offset"], reverse=True):
        first, last = max(batch["base_offset"], start_of_log), min(batch["last_offset"], before - 1)
        if last < first:
            continue  # begins at `before` (nothing of it is before), or wholly below the log start
        if held + last - first + 1 >= count:
            return last - (count - held) + 1
        held += last - first + 1
    return start_of_log


def _shown(field: str | None, form: int) -> tuple[str | None, bool]:
    """A stored field as the page shows it, and whether that is base64: its text when its bytes are
    UTF-8, whatever form its record was stored in."""
    if field is None or form != record_codec.FORM_BASE64:
        return field, False
    try:
        return base64.b64decode(field).decode("utf-8"), False
    except UnicodeDecodeError:
        return field, True


def _status(batch: asyncpg.Record) -> str:
    if batch["control_type"] is not None:
        return MARKER
    if not batch["is_transactional"]:
        return PLAIN
    return _STATUS_OF_MARKER.get(batch["decided_by"], OPEN)


async def read_window(conn: asyncpg.Connection, topic_id: int, partition: int, start: int, end: int) -> list[LogEntry]:
    """Every record and marker with an offset in [start, end), in offset order."""
    entries: list[LogEntry] = []
    for batch in await conn.fetch(_WINDOW_SQL, topic_id, partition, start, end):
        status = _status(batch)
        base = batch["base_offset"]
        control = CONTROL_TYPE_NAMES.get(batch["control_type"])
        if control is not None:
            entries.append(
                LogEntry(
                    base,
                    batch["first_timestamp_ms"],
                    None,
                    None,
                    [],
                    False,
                    False,
                    batch["producer_id"],
                    batch["producer_epoch"],
                    None,
                    True,
                    MARKER,
                    control,
                    None,
                    batch["first_offset"],
                )
            )
            continue
        stored = record_codec.decode_payload(batch["records"], base)
        decided_at = batch["marker_offset"] if status in (COMMITTED, ABORTED) else None
        for index in range(max(start - base, 0), min(len(stored), end - base, batch["last_offset"] - base + 1)):
            if stored[index] is None:  # removed by compaction: its offset stays empty
                continue
            timestamp_ms, key, value, headers, form = stored[index]
            key, key_base64 = _shown(key, form)
            value, value_base64 = _shown(value, form)
            sequence = batch["base_sequence"] + index if batch["base_sequence"] >= 0 else None
            entries.append(
                LogEntry(
                    base + index,
                    timestamp_ms,
                    key,
                    value,
                    [(header_key, *_shown(header_value, form)) for header_key, header_value in headers],
                    key_base64,
                    value_base64,
                    batch["producer_id"],
                    batch["producer_epoch"],
                    sequence,
                    batch["is_transactional"],
                    status,
                    None,
                    decided_at,
                    None,
                )
            )
    return entries


@dataclass(frozen=True, slots=True)
class ProducerOnPartition:
    """DescribeProducers' entry, with the transactional id the producer id was issued for."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    current_txn_first_offset: int | None
    transactional_id: str | None


async def producers(
    conn: asyncpg.Connection, topic_id: int, partition: int, after_producer_id: int, limit: int
) -> list[ProducerOnPartition]:
    """Producers with state on the partition, by producer id after `after_producer_id` (keyset)."""
    rows = await conn.fetch(
        "SELECT s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp_ms, s.current_txn_first_offset, "
        "       i.transactional_id "
        "FROM producer_states s LEFT JOIN producer_ids i ON i.producer_id = s.producer_id "
        "WHERE s.topic_id = $1 AND s.partition = $2 AND s.producer_id > $3 ORDER BY s.producer_id LIMIT $4",
        topic_id,
        partition,
        after_producer_id,
        limit,
    )
    return all_from_rows(ProducerOnPartition, rows)


@dataclass(frozen=True, slots=True)
class MarkerEntry:
    offset: int
    control: str  # "COMMIT" or "ABORT"
    producer_id: int
    producer_epoch: int
    first_offset: int | None  # the first offset of the transaction on this partition
    timestamp_ms: int
    transactional_id: str | None


async def markers_before(
    conn: asyncpg.Connection, topic_id: int, partition: int, before_offset: int, limit: int
) -> list[MarkerEntry]:
    """The partition's markers below `before_offset`, newest first (an index range on
    txn_markers' primary key, read backwards)."""
    rows = await conn.fetch(
        "SELECT m.marker_offset AS offset, m.control_type, m.producer_id, m.producer_epoch, m.first_offset, "
        "       m.timestamp_ms, i.transactional_id "
        "FROM txn_markers m LEFT JOIN producer_ids i ON i.producer_id = m.producer_id "
        "WHERE m.topic_id = $1 AND m.partition = $2 AND m.marker_offset < $3 "
        "ORDER BY m.marker_offset DESC LIMIT $4",
        topic_id,
        partition,
        before_offset,
        limit,
    )
    return [from_row(MarkerEntry, row, control=CONTROL_TYPE_NAMES[row["control_type"]]) for row in rows]
