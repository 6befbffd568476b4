"""Consumer groups: membership with server-side assignment, committed offsets, and transactional
offsets pending until their transaction's marker.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumer_groups",
        sa.Column("group_id", sa.Text(), primary_key=True),
        sa.Column("generation_id", sa.Integer(), nullable=False),
        sa.Column("assignment", postgresql.JSONB(), nullable=False),
        sa.Column("last_update_ms", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "group_members",
        sa.Column("group_id", sa.Text(), primary_key=True),
        sa.Column("member_id", sa.Text(), primary_key=True),
        sa.Column("topics", postgresql.JSONB(), nullable=False),
        sa.Column("session_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("joined_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_heartbeat_ms", sa.BigInteger(), nullable=False),
    )
    # The session-expiry worker looks for members whose session ran out.
    op.create_index("group_members_by_deadline", "group_members", [sa.text("(last_heartbeat_ms + session_timeout_ms)")])
    op.create_table(
        "group_offsets",
        sa.Column("group_id", sa.Text(), primary_key=True),
        sa.Column("topic", sa.Text(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("committed_offset", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.Column("commit_timestamp_ms", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "pending_txn_offsets",
        sa.Column("group_id", sa.Text(), primary_key=True),
        sa.Column("topic", sa.Text(), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("producer_id", sa.BigInteger(), primary_key=True),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("offsets_partition", sa.Integer(), nullable=False),
        sa.Column("committed_offset", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.Column("commit_timestamp_ms", sa.BigInteger(), nullable=False),
    )
    # A marker in __consumer_offsets partition P of producer X settles exactly these rows.
    op.create_index(
        "pending_txn_offsets_by_transaction",
        "pending_txn_offsets",
        ["offsets_partition", "producer_id", "producer_epoch"],
    )


def downgrade() -> None:
    op.drop_table("pending_txn_offsets")
    op.drop_table("group_offsets")
    op.drop_table("group_members")
    op.drop_table("consumer_groups")
