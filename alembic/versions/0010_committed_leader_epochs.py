"""Committed leader epochs: a group's offset keeps the leader epoch its commit carried, as Kafka's
OffsetCommitValue does (OffsetCommit v6+ and TxnOffsetCommit v2+ send it, OffsetFetch v5+ returns
it), so a consumer resuming from it knows which leader's log it read. -1 is Kafka's "no epoch":
what older versions and HTTP commit without one.

Offsets committed before the upgrade had their epoch dropped, so they read back as -1, the
column's default. A constant default makes each ADD COLUMN a change of the catalog only
(PostgreSQL 11+): no table rewrite, and existing rows read the default.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_TABLES = ("group_offsets", "pending_txn_offsets")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("leader_epoch", sa.Integer(), nullable=False, server_default="-1"))


def downgrade() -> None:
    for table in _TABLES:
        op.drop_column(table, "leader_epoch")
