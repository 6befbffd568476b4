"""Idempotent producers and transactions: producer ids, per-partition producer state, the
coordinator's transaction metadata, and transaction markers.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Producer ids come from a sequence: unique across restarts and across server processes.
    op.execute("CREATE SEQUENCE producer_id_seq AS bigint START 1000")
    op.create_table(
        "producer_ids",
        sa.Column("producer_id", sa.BigInteger(), primary_key=True),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("transactional_id", sa.Text(), nullable=True),
        sa.Column("issued_ms", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "producer_states",
        sa.Column("topic_id", sa.Integer(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("producer_id", sa.BigInteger(), primary_key=True),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.Column("last_timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("recent_batches", postgresql.JSONB(), nullable=False),
        sa.Column("current_txn_first_offset", sa.BigInteger(), nullable=True),
    )
    # The LSO of a partition is the smallest first offset of its open transactions: this partial
    # index makes that a single probe, however many producers the partition has seen.
    op.create_index(
        "producer_states_open_transactions",
        "producer_states",
        ["topic_id", "partition", "current_txn_first_offset"],
        postgresql_where=sa.text("current_txn_first_offset IS NOT NULL"),
    )
    op.create_table(
        "transactions",
        sa.Column("transactional_id", sa.Text(), primary_key=True),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("last_producer_id", sa.BigInteger(), nullable=True),
        sa.Column("last_producer_epoch", sa.SmallInteger(), nullable=True),
        sa.Column("txn_producer_id", sa.BigInteger(), nullable=True),
        sa.Column("txn_producer_epoch", sa.SmallInteger(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("timeout_ms", sa.Integer(), nullable=False),
        sa.Column("txn_start_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_update_ms", sa.BigInteger(), nullable=False),
        sa.Column("partitions", postgresql.JSONB(), nullable=False),
        sa.Column("groups", postgresql.JSONB(), nullable=False),
    )
    op.create_index("transactions_by_state", "transactions", ["state"])
    op.create_table(
        "txn_markers",
        sa.Column("topic_id", sa.Integer(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("producer_id", sa.BigInteger(), primary_key=True),
        sa.Column("producer_epoch", sa.SmallInteger(), primary_key=True),
        sa.Column("control_type", sa.SmallInteger(), nullable=False),
        sa.Column("marker_offset", sa.BigInteger(), nullable=False),
        sa.Column("first_offset", sa.BigInteger(), nullable=True),
        sa.Column("timestamp_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index("txn_markers_by_offset", "txn_markers", ["topic_id", "partition", "marker_offset"])


def downgrade() -> None:
    op.drop_table("txn_markers")
    op.drop_table("transactions")
    op.drop_table("producer_states")
    op.drop_table("producer_ids")
    op.execute("DROP SEQUENCE producer_id_seq")
