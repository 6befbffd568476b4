"""The log's lifecycle: per-partition cleanup status (retention, DeleteRecords, compaction), the
topics whose rows are still being removed after DeleteTopics, the new topic config keys, and
autovacuum tuned for tables whose rows are deleted or updated in bulk.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Vacuum once 2% of a table is dead (PostgreSQL's default waits for 20%): retention deletes a steady
# trickle of old batches, and the space they free is reused by new ones only once vacuumed. The
# cost limit lets one vacuum keep up with that trickle instead of sleeping most of the time.
_BULK_CHANGED_TABLES = (
    "record_batches",
    "txn_markers",
    "producer_states",
    "partitions",
    "transactions",
    "producer_ids",
    "group_offsets",
    "pending_txn_offsets",
)
_AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_limit = 2000"
)
_AUTOVACUUM_KEYS = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_cost_limit"
)


def upgrade() -> None:
    op.create_table(
        "partition_cleanups",
        sa.Column("topic_id", sa.Integer(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("last_cleanup_ms", sa.BigInteger(), nullable=True),
        sa.Column("removed_batches", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("rewritten_batches", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("compacted_through", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("oldest_tombstone_ms", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "deleted_topics",
        sa.Column("topic_id", sa.Integer(), primary_key=True),
        sa.Column("deleted_ms", sa.BigInteger(), nullable=False),
    )
    # Rows of topics deleted before this revision: the cleaner removes them like any deleted topic's.
    op.execute(
        "INSERT INTO deleted_topics (topic_id, deleted_ms) "
        "SELECT DISTINCT s.topic_id, (extract(epoch FROM now()) * 1000)::bigint FROM ("
        "  SELECT topic_id FROM producer_states UNION SELECT topic_id FROM txn_markers) s "
        "WHERE NOT EXISTS (SELECT 1 FROM topics t WHERE t.topic_id = s.topic_id)"
    )
    # Existing topics get the new keys' defaults; the internal ones are compacted (as Kafka's).
    op.execute("""UPDATE topics SET config = jsonb_build_object(
        'cleanup_policy', CASE WHEN is_internal THEN 'compact' ELSE 'delete' END,
        'delete_retention_ms', 86400000) || config""")
    for table in _BULK_CHANGED_TABLES:
        op.execute(f"ALTER TABLE {table} SET ({_AUTOVACUUM})")


def downgrade() -> None:
    for table in _BULK_CHANGED_TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({_AUTOVACUUM_KEYS})")
    op.execute("UPDATE topics SET config = config - 'cleanup_policy' - 'delete_retention_ms'")
    op.drop_table("deleted_topics")
    op.drop_table("partition_cleanups")
