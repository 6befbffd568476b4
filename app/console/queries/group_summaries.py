"""Consumer groups for the console, a page at a time: groups with their members, committed
partitions, total lag and pending transactional offsets; a group's members, committed offsets with
lag, and the transactional offsets waiting for their transaction's marker.

Read-only. Pages are keyset ranges of primary keys (group id; member id; topic and partition), so a
page costs the same however many groups, members or partitions there are. Lag is
`group_offsets`' rule (records, not markers; a bounded count of markers, past which it is an upper
bound), which HTTP's describe answers too.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.groups.group_offsets import (
    LAG_BOUNDED_SQL,
    LAG_JOINS_SQL,
    LAG_SQL,
    PartitionLag,
    lags_from_rows,
)
from app.storage.groups.groups import (
    CLASSIC_STATE_KEY,
    ClassicKind,
    Member,
    classic_kind_from_json,
    classic_kind_sql,
)
from app.storage.rows import all_from_rows, from_row

NO_GROUP = ""  # sorts before every group id: the keyset start of the first page


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    generation_id: int
    last_update_ms: int
    members: int
    committed_partitions: int
    pending_offsets: int
    lag: int
    lag_bounded: bool  # a partition's lag is an upper bound (group_offsets.MARKERS_COUNTED): so is the sum
    # What the group row's Kafka classic state says of its kind (None: no Kafka member ever joined):
    # the console's page makes it the group's state with the one rule, classic_groups.kind_of, which
    # every other view of a group applies to the same inputs.
    classic: ClassicKind | None


# The group row's kind, over this query's alias `g` and its parameter $4 (CLASSIC_STATE_KEY): a
# constant, as SQL is built from constants only.
_CLASSIC_KIND_SQL = classic_kind_sql("g.assignment", "$4")
_GROUP_PAGE_SQL = f"""
SELECT g.group_id, g.generation_id, g.last_update_ms,
       (SELECT count(*) FROM group_members x WHERE x.group_id = g.group_id) AS members,
       (SELECT count(*) FROM group_offsets x WHERE x.group_id = g.group_id) AS committed_partitions,
       (SELECT count(*) FROM pending_txn_offsets x WHERE x.group_id = g.group_id) AS pending_offsets,
       lags.lag, lags.lag_bounded,
       {_CLASSIC_KIND_SQL} AS classic
FROM consumer_groups g
CROSS JOIN LATERAL (
    SELECT coalesce(sum({LAG_SQL}), 0)::bigint AS lag, coalesce(bool_or({LAG_BOUNDED_SQL}), false)
               AS lag_bounded
    FROM group_offsets o
    JOIN topics t ON t.name = o.topic
    {LAG_JOINS_SQL}
    WHERE o.group_id = g.group_id AND hw.high_watermark IS NOT NULL
) lags
WHERE g.group_id > $1 AND ($3::text IS NULL OR starts_with(g.group_id, $3))
ORDER BY g.group_id LIMIT $2
"""


async def group_page(conn: asyncpg.Connection, after: str | None, prefix: str | None, limit: int) -> list[GroupSummary]:
    """Groups by id after `after` (keyset), optionally only those starting with `prefix`."""
    rows = await conn.fetch(_GROUP_PAGE_SQL, after or NO_GROUP, limit, prefix, CLASSIC_STATE_KEY)
    return [from_row(GroupSummary, row, classic=classic_kind_from_json(row["classic"])) for row in rows]


async def member_page(conn: asyncpg.Connection, group_id: str, after: str | None, limit: int) -> list[Member]:
    rows = await conn.fetch(
        "SELECT member_id, topics, session_timeout_ms, joined_ms, last_heartbeat_ms FROM group_members "
        "WHERE group_id = $1 AND member_id > $2 ORDER BY member_id LIMIT $3",
        group_id,
        after or "",
        limit,
    )
    return all_from_rows(Member, rows)


# The page's keys first (a primary-key range), then the lag of those rows only.
_OFFSET_PAGE_SQL = f"""
WITH o AS (
    SELECT group_id, topic, partition, committed_offset, metadata, leader_epoch FROM group_offsets
    WHERE group_id = $1 AND (topic, partition) > ($2, $3) ORDER BY topic, partition LIMIT $4
)
SELECT o.topic, o.partition, o.committed_offset, o.metadata, o.leader_epoch, hw.high_watermark,
       CASE WHEN hw.high_watermark IS NOT NULL THEN {LAG_SQL} END AS lag,
       coalesce(hw.high_watermark IS NOT NULL AND {LAG_BOUNDED_SQL}, false) AS lag_bounded,
       EXISTS (SELECT 1 FROM pending_txn_offsets q WHERE q.group_id = o.group_id AND q.topic = o.topic
               AND q.partition = o.partition) AS pending
FROM o
LEFT JOIN topics t ON t.name = o.topic
{LAG_JOINS_SQL}ORDER BY o.topic, o.partition
"""


async def offset_page(
    conn: asyncpg.Connection, group_id: str, after: tuple[str, int] | None, limit: int
) -> list[PartitionLag]:
    """Committed offsets by (topic, partition) after `after` (keyset), with the lag of each (None,
    like the high watermark, when the topic or partition no longer exists)."""
    topic, partition = after if after is not None else ("", -1)
    rows = await conn.fetch(_OFFSET_PAGE_SQL, group_id, topic, partition, limit)
    return lags_from_rows(rows)


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """A TxnOffsetCommit waiting for its transaction's marker in __consumer_offsets."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int  # committed with the offset (Kafka's TxnOffsetCommit v2+); -1: none
    producer_id: int
    producer_epoch: int
    commit_timestamp_ms: int
    transactional_id: str | None
    state: str | None  # the transactional id's current state


async def pending_offsets(
    conn: asyncpg.Connection, group_id: str, after: tuple[str, int, int] | None, limit: int
) -> list[PendingOffset]:
    """By (topic, partition, producer id) after `after` (keyset), with the transactional id each
    producer id was issued for and that id's state."""
    topic, partition, producer_id = after if after is not None else ("", -1, -1)
    rows = await conn.fetch(
        "SELECT q.topic, q.partition, q.committed_offset AS offset, q.leader_epoch, q.producer_id, q.producer_epoch, "
        "       q.commit_timestamp_ms, "
        "       i.transactional_id, x.state "
        "FROM pending_txn_offsets q LEFT JOIN producer_ids i ON i.producer_id = q.producer_id "
        "LEFT JOIN transactions x ON x.transactional_id = i.transactional_id "
        "WHERE q.group_id = $1 AND (q.topic, q.partition, q.producer_id) > ($2, $3, $4) "
        "ORDER BY q.topic, q.partition, q.producer_id LIMIT $5",
        group_id,
        topic,
        partition,
        producer_id,
        limit,
    )
    return all_from_rows(PendingOffset, rows)
