"""A transactional id's history for the console: its state transitions as recorded in
`__transaction_state`, the markers its transactions wrote, and its producer epochs over time.

Read-only. The log has no index by key, so the history is read backwards from an offset, a
bounded number of batches per page: the cost of a page is bounded whatever the log's length, and
the caller pages on with `next_before`. Each batch of the log holds the transitions of one
coordinator request for one transactional id (TransactionLog._append_records), so a page ends on a
batch boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
import orjson

from app.storage.log import record_codec
from app.storage.log.markers import CONTROL_TYPE_NAMES
from app.storage.log.topics import TopicInfo
from app.storage.rows import from_row
from txbroker.wire import partition_for_key

SCAN_CHUNK = 2_000  # batches per query
END_OF_LOG = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Transition:
    """One `__transaction_state` record: the metadata right after a state change."""

    offset: int
    timestamp_ms: int
    state: str
    producer_id: int
    producer_epoch: int
    txn_producer_id: int | None
    txn_producer_epoch: int | None
    timeout_ms: int
    txn_start_ms: int
    partitions: list[tuple[str, int]]
    groups: list[str]
    # How the last EndTxn ended a transaction (1: classic, 2: KIP-890's bump), None (null) before
    # the id's first EndTxn; records written before versions were logged are of version 2 (every
    # transaction ended with a bump then).
    transaction_version: int | None = 2


@dataclass(frozen=True, slots=True)
class HistoryPage:
    log_partition: int  # the __transaction_state partition that holds this id's records
    transitions: list[Transition]  # newest first
    next_before: int | None  # where the next (older) page starts; None at the start of the log
    scanned_batches: int


# The newest `$4` batches below offset `$3`, and among them those holding a record whose fields
# include the string `$5` (JSON containment is positional-free, so the caller checks that it is the
# key). The last row carries the lowest offset scanned (NULL when nothing was left) and, in
# `last_offset`, how many batches were scanned.
_SCAN_SQL = """
WITH scanned AS (
    SELECT base_offset, last_offset, records FROM record_batches
    WHERE topic_id = $1 AND partition = $2 AND last_offset < $3
    ORDER BY last_offset DESC LIMIT $4
)
SELECT false AS boundary, base_offset, last_offset, records FROM scanned
WHERE convert_from(records, 'UTF8')::jsonb @> $5::jsonb
UNION ALL
SELECT true, min(base_offset), count(*), NULL FROM scanned
ORDER BY boundary, last_offset DESC
"""


def _transition(offset: int, timestamp_ms: int, value: dict) -> Transition:
    return Transition(
        offset,
        timestamp_ms,
        value["state"],
        value["producer_id"],
        value["producer_epoch"],
        value.get("txn_producer_id"),
        value.get("txn_producer_epoch"),
        value["timeout_ms"],
        value["txn_start_ms"],
        [(topic, partition) for topic, partition in value["partitions"]],
        list(value["groups"]),
        value.get("transaction_version", 2),
    )


async def transitions(
    conn: asyncpg.Connection,
    log_topic: TopicInfo,
    transactional_id: str,
    before: int | None,
    limit: int,
    scan_budget: int,
) -> HistoryPage:
    """The id's transitions below offset `before` (None: the end of the log), newest first: at least
    `limit` of them unless `scan_budget` batches were read first or the log's start was reached."""
    log_partition = partition_for_key(transactional_id.encode(), log_topic.partition_count)
    found: list[Transition] = []
    position = END_OF_LOG if before is None else before
    scanned = 0
    while True:
        rows = await conn.fetch(
            _SCAN_SQL, log_topic.topic_id, log_partition, position, SCAN_CHUNK, [[transactional_id]]
        )
        lowest, count = rows[-1]["base_offset"], rows[-1]["last_offset"]
        for row in rows[:-1]:
            stored = record_codec.decode_payload(row["records"], row["base_offset"])
            for index in reversed(range(len(stored))):
                if stored[index] is None:  # removed by compaction
                    continue
                timestamp_ms, key, value, _headers, form = stored[index]
                if key == transactional_id and form == record_codec.FORM_TEXT and value is not None:
                    found.append(_transition(row["base_offset"] + index, timestamp_ms, orjson.loads(value)))
            if len(found) >= limit:
                return HistoryPage(log_partition, found, row["base_offset"] or None, scanned + count)
        scanned += count
        if count < SCAN_CHUNK or not lowest:  # the start of the log
            return HistoryPage(log_partition, found, None, scanned)
        position = lowest
        if scanned >= scan_budget:
            return HistoryPage(log_partition, found, position, scanned)


@dataclass(frozen=True, slots=True)
class WrittenMarker:
    topic: str
    partition: int
    offset: int
    control: str  # "COMMIT" or "ABORT"
    producer_id: int
    producer_epoch: int
    timestamp_ms: int
    first_offset: int | None


# Each (partition, producer id, epoch) the transitions name is one primary-key probe of txn_markers.
_MARKERS_SQL = """
SELECT c.topic, c.partition, m.marker_offset AS offset, m.control_type, m.producer_id, m.producer_epoch, m.timestamp_ms,
       m.first_offset
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::smallint[]) AS c(topic, partition, producer_id, producer_epoch)
JOIN topics t ON t.name = c.topic
JOIN txn_markers m ON m.topic_id = t.topic_id AND m.partition = c.partition AND m.producer_id = c.producer_id
     AND m.producer_epoch = c.producer_epoch
ORDER BY m.timestamp_ms DESC, m.producer_epoch DESC, c.topic, c.partition
"""


async def markers_written(conn: asyncpg.Connection, found: list[Transition], limit: int) -> list[WrittenMarker]:
    """The markers of the transactions these transitions describe (each transition names its open
    transaction's partitions and the producer id/epoch its records, hence its markers, carry)."""
    keys = dict.fromkeys(
        (topic, partition, t.txn_producer_id, t.txn_producer_epoch)
        for t in found
        if t.txn_producer_id is not None
        for topic, partition in t.partitions
    )
    if not keys:
        return []
    topics, partitions, producer_ids, epochs = (list(column) for column in zip(*keys, strict=True))
    rows = await conn.fetch(_MARKERS_SQL + " LIMIT $5", topics, partitions, producer_ids, epochs, limit)
    return [from_row(WrittenMarker, row, control=CONTROL_TYPE_NAMES[row["control_type"]]) for row in rows]


@dataclass(frozen=True, slots=True)
class EpochChange:
    producer_id: int
    producer_epoch: int
    timestamp_ms: int
    state: str  # the state recorded with the new epoch: says what bumped it


def epoch_history(found: list[Transition]) -> list[EpochChange]:
    """Each producer id/epoch the id went through, in the order of the transitions, newest first."""
    changes: list[EpochChange] = []
    previous = None
    for transition in reversed(found):  # oldest first
        current = (transition.producer_id, transition.producer_epoch)
        if current != previous:
            changes.append(EpochChange(*current, transition.timestamp_ms, transition.state))
            previous = current
    return changes[::-1]
