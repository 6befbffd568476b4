"""The log cleaner's bookkeeping, shared by retention (log_cleaner.py) and compaction
(log_compaction.py): what a run did, what each partition's last cleanup was (`partition_cleanups`,
shown by the console), and the rules both apply to their PostgreSQL transactions."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.storage.rows import from_row

# The coordinator's states in which a transaction's markers may still be (re-)written.
COMPLETING_STATES = ["PrepareCommit", "PrepareAbort"]

# A chunk's commit need not wait for its WAL flush: what a crash of PostgreSQL could lose of it is
# a suffix of chunks (WAL is replayed in order), which the next run simply does again. The log start
# a chunk works from was advanced by a durable commit (DeleteRecords, retention) before.
ASYNC_COMMIT_SQL = "SET LOCAL synchronous_commit = off"


@dataclass(slots=True)
class CleanupTotals:
    """What one cleaner run did, over every partition it cleaned."""

    partitions: int = 0
    removed_batches: int = 0
    rewritten_batches: int = 0
    removed_markers: int = 0
    deleted_topic_rows: int = 0

    def total(self) -> int:
        return self.removed_batches + self.rewritten_batches + self.removed_markers + self.deleted_topic_rows


async def note_cleanup(conn: asyncpg.Connection, topic_id: int, partition: int, removed: int, rewritten: int) -> None:
    """Records what a chunk did, in that chunk's PostgreSQL transaction (for the console)."""
    await conn.execute(
        "UPDATE partition_cleanups SET last_cleanup_ms = $3, removed_batches = removed_batches + $4, "
        "rewritten_batches = rewritten_batches + $5 WHERE topic_id = $1 AND partition = $2",
        topic_id,
        partition,
        now_ms(),
        removed,
        rewritten,
    )


@dataclass(frozen=True, slots=True)
class CleanupStatus:
    last_cleanup_ms: int | None  # the last time the cleaner removed or rewrote a batch here
    removed_batches: int  # batches (and markers) removed so far
    rewritten_batches: int  # batches compaction rewrote with holes
    compacted_through: int  # compaction has run up to this offset


async def cleanup_status(conn: asyncpg.Connection, topic_id: int, partition: int) -> CleanupStatus | None:
    """None when the cleaner never looked at the partition."""
    row = await conn.fetchrow(
        "SELECT last_cleanup_ms, removed_batches, rewritten_batches, compacted_through FROM partition_cleanups "
        "WHERE topic_id = $1 AND partition = $2",
        topic_id,
        partition,
    )
    return None if row is None else from_row(CleanupStatus, row)
