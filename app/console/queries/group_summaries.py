"""Consumer groups for the console, a page at a time: groups with their members, committed
partitions, total lag and pending transactional offsets; a group's members, committed offsets with
lag, and the transactional offsets waiting for their transaction's marker.

Read-only. Pages are keyset ranges of primary keys (group id; member id; topic and partition), so a
page costs the same however many groups, members or partitions there are. Lag counts records, not
markers, as `group_offsets.lags` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.groups.group_offsets import PartitionLag, lags_from_rows
from app.storage.groups.groups import CLASSIC_STATE_KEY, Member
from app.storage.rows import all_from_rows

NO_GROUP = ""  # sorts before every group id: the keyset start of the first page

# The high watermark of a committed offset's partition, one primary-key probe (written as a scalar
# subquery so the plan stays a probe even before the tables have statistics).
_HIGH_WATERMARK = (
    "(SELECT p.high_watermark FROM partitions p WHERE p.topic_id = t.topic_id AND p.partition = o.partition)"
)

# Records (not markers) between a committed offset and the high watermark: the marker count is an
# index range on txn_markers' primary key. A negative committed offset (Kafka's OffsetCommit stores
# one as given) is no position, so it has no lag (NULL), as Kafka's kafka-consumer-groups.sh shows
# none for it, rather than one counted from below offset 0.
_LAG_EXPRESSION = """
CASE WHEN o.committed_offset >= 0 THEN
  greatest(hw.high_watermark - o.committed_offset, 0)
    - (SELECT count(*) FROM txn_markers m WHERE m.topic_id = t.topic_id AND m.partition = o.partition
       AND m.marker_offset >= o.committed_offset AND m.marker_offset < hw.high_watermark)
END
"""


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    generation_id: int
    last_update_ms: int
    members: int
    committed_partitions: int
    pending_offsets: int
    lag: int
    # A Kafka group's own rebalance state (the classic protocol's, kept in the group row) while it
    # has Kafka members, else None: classic_groups.group_kind's rule, which the group page applies.
    classic_state: str | None

    @property
    def state(self) -> str:
        if self.classic_state is not None:
            return self.classic_state
        return "Stable" if self.members else "Empty"


_GROUP_PAGE_SQL = f"""
SELECT g.group_id, g.generation_id, g.last_update_ms,
       (SELECT count(*) FROM group_members x WHERE x.group_id = g.group_id) AS members,
       (SELECT count(*) FROM group_offsets x WHERE x.group_id = g.group_id) AS committed_partitions,
       (SELECT count(*) FROM pending_txn_offsets x WHERE x.group_id = g.group_id) AS pending_offsets,
       (SELECT coalesce(sum({_LAG_EXPRESSION}), 0) FROM group_offsets o
        JOIN topics t ON t.name = o.topic
        CROSS JOIN LATERAL (SELECT {_HIGH_WATERMARK} AS high_watermark) hw
        WHERE o.group_id = g.group_id AND hw.high_watermark IS NOT NULL)::bigint AS lag,
       CASE WHEN g.assignment -> $4::text -> 'members' <> '{{}}'::jsonb THEN g.assignment -> $4::text ->> 'state' END
           AS classic_state
FROM consumer_groups g
WHERE g.group_id > $1 AND ($3::text IS NULL OR starts_with(g.group_id, $3))
ORDER BY g.group_id LIMIT $2
"""


async def group_page(conn: asyncpg.Connection, after: str | None, prefix: str | None, limit: int) -> list[GroupSummary]:
    """Groups by id after `after` (keyset), optionally only those starting with `prefix`."""
    rows = await conn.fetch(_GROUP_PAGE_SQL, after or NO_GROUP, limit, prefix, CLASSIC_STATE_KEY)
    return all_from_rows(GroupSummary, rows)


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
       CASE WHEN hw.high_watermark IS NOT NULL THEN {_LAG_EXPRESSION} END AS lag,
       EXISTS (SELECT 1 FROM pending_txn_offsets q WHERE q.group_id = o.group_id AND q.topic = o.topic
               AND q.partition = o.partition) AS pending
FROM o
LEFT JOIN topics t ON t.name = o.topic
CROSS JOIN LATERAL (SELECT {_HIGH_WATERMARK} AS high_watermark) hw
ORDER BY o.topic, o.partition
"""


async def offset_page(
    conn: asyncpg.Connection, group_id: str, after: tuple[str, int] | None, limit: int
) -> list[PartitionLag]:
    """Committed offsets by (topic, partition) after `after` (keyset), with the lag of each (None,
    like the high watermark, when the topic or partition no longer exists)."""
    topic, partition = after if after is not None else ("", -1)
    return lags_from_rows(await conn.fetch(_OFFSET_PAGE_SQL, group_id, topic, partition, limit))


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
