"""Each group member's revocation deadline: when a member of a KIP-848 consumer group that must give
up partitions is removed unless it has (its rebalance timeout from when it was asked), NULL for
every other member. The eviction worker finds the overdue ones through its index, as it finds the
lapsed sessions through group_members_by_deadline, instead of reading every group row's state.

A nullable column without a default is a change of the catalog only: no table rewrite; the index
holds the members' rows (small), every value NULL until a consumer group member revokes.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("group_members", sa.Column("revocation_due_ms", sa.BigInteger(), nullable=True))
    op.create_index("group_members_by_revocation_due", "group_members", ["revocation_due_ms"])


def downgrade() -> None:
    op.drop_index("group_members_by_revocation_due", table_name="group_members")
    op.drop_column("group_members", "revocation_due_ms")
