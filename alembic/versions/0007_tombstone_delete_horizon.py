"""Compaction's delete horizon (KIP-534): a tombstone stays `delete_retention_ms` after the cleaner
first kept it, no longer after the record's timestamp (the client's). Each batch gets the time the
cleaner first kept a tombstone of it; each partition's cleanup row, the earliest such time of the
tombstones kept (it replaces the oldest tombstone's record timestamp).

Tombstones that exist at the upgrade start their horizon at the upgrade: the batches the cleaner
has already compacted (below `compacted_through`) of partitions where it kept a tombstone are
stamped now. A batch it has not compacted yet is stamped when it first is, as any new one.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


def upgrade() -> None:
    op.add_column("record_batches", sa.Column("tombstones_seen_ms", sa.BigInteger(), nullable=True))
    op.alter_column("partition_cleanups", "oldest_tombstone_ms", new_column_name="earliest_tombstone_seen_ms")
    # Stamps every data batch that may hold a kept tombstone (a batch without one ignores its stamp):
    # only partitions that kept one, only what was compacted, so a compacted log's size at most.
    op.execute(
        f"UPDATE record_batches b SET tombstones_seen_ms = {_NOW_MS} FROM partition_cleanups c "
        "WHERE c.topic_id = b.topic_id AND c.partition = b.partition "
        "  AND c.earliest_tombstone_seen_ms IS NOT NULL "
        "  AND b.last_offset < c.compacted_through AND b.control_type IS NULL"
    )
    op.execute(
        f"UPDATE partition_cleanups SET earliest_tombstone_seen_ms = {_NOW_MS} "
        "WHERE earliest_tombstone_seen_ms IS NOT NULL"
    )


def downgrade() -> None:
    # The record timestamps are not kept: the oldest tombstone is taken as due at the next run,
    # which finds the tombstones' own timestamps again.
    op.execute(
        "UPDATE partition_cleanups SET earliest_tombstone_seen_ms = 0 WHERE earliest_tombstone_seen_ms IS NOT NULL"
    )
    op.alter_column("partition_cleanups", "earliest_tombstone_seen_ms", new_column_name="oldest_tombstone_ms")
    op.drop_column("record_batches", "tombstones_seen_ms")
