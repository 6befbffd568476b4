"""What the console warns about: transactions open too long, and open transactions holding back a
partition's last stable offset (LSO), with how many transactional ids are in each state.

Read-only. The callers pass the open states (the coordinator owns the state machine; storage only
knows its persisted values). Each query reads a bounded set of rows: open transactions through
the `transactions_by_state` index, LSO pins through the partial index of open producer states.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.rows import all_from_rows


async def counts_by_state(conn: asyncpg.Connection) -> dict[str, int]:
    """How many transactional ids are in each state (an index-only count on transactions_by_state)."""
    rows = await conn.fetch("SELECT state, count(*) AS n FROM transactions GROUP BY state")
    return {row["state"]: row["n"] for row in rows}


@dataclass(frozen=True, slots=True)
class OverdueTransaction:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    txn_start_ms: int
    partition_count: int


@dataclass(frozen=True, slots=True)
class Overdue:
    transactions: list[OverdueTransaction]  # the oldest first, at most the limit
    total: int


async def overdue(
    conn: asyncpg.Connection, open_states: list[str], now_ms: int, fraction: float, limit: int
) -> Overdue:
    """Open transactions older than `fraction` of their timeout, the oldest first."""
    rows = await conn.fetch(
        "SELECT transactional_id, state, producer_id, producer_epoch, timeout_ms, txn_start_ms, "
        "       jsonb_array_length(partitions) AS partition_count, count(*) OVER () AS total "
        "FROM transactions WHERE state = ANY($1::text[]) AND txn_start_ms <> -1 "
        "  AND ($2::bigint - txn_start_ms) > timeout_ms * $3::float8 "
        "ORDER BY txn_start_ms, transactional_id LIMIT $4",
        open_states,
        now_ms,
        fraction,
        limit,
    )
    return Overdue(all_from_rows(OverdueTransaction, rows), rows[0]["total"] if rows else 0)


@dataclass(frozen=True, slots=True)
class LsoPin:
    """A producer's open transaction on a partition, from its first offset there to the HW."""

    topic: str
    partition: int
    high_watermark: int
    first_offset: int
    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    state: str | None  # the transactional id's state, None if it has none (or no longer has one)
    txn_start_ms: int | None
    timeout_ms: int | None
    owned: bool  # the coordinator's open transaction of that id was written with this producer id/epoch

    @property
    def held_back(self) -> int:
        return max(self.high_watermark - self.first_offset, 0)


# Open producer states come from the partial index; each is joined by primary key to its partition,
# topic, the transactional id its producer id was issued for, and that id's current metadata.
_PINS_SQL = """
SELECT t.name AS topic, s.partition, p.high_watermark, s.current_txn_first_offset AS first_offset,
       s.producer_id, s.producer_epoch,
       i.transactional_id, x.state, x.txn_start_ms, x.timeout_ms,
       coalesce(x.state = ANY($1::text[]) AND x.txn_producer_id = s.producer_id
                AND x.txn_producer_epoch = s.producer_epoch, false) AS owned
FROM producer_states s
JOIN partitions p ON p.topic_id = s.topic_id AND p.partition = s.partition
JOIN topics t ON t.topic_id = s.topic_id
LEFT JOIN producer_ids i ON i.producer_id = s.producer_id
LEFT JOIN transactions x ON x.transactional_id = i.transactional_id
WHERE s.current_txn_first_offset IS NOT NULL
ORDER BY p.high_watermark - s.current_txn_first_offset DESC, t.name, s.partition
LIMIT $2
"""


async def lso_pins(conn: asyncpg.Connection, open_states: list[str], limit: int) -> list[LsoPin]:
    """Open transactions per partition, the ones holding back the most offsets first."""
    return all_from_rows(LsoPin, await conn.fetch(_PINS_SQL, open_states, limit))
