"""Each group's own configs (Kafka 4.0's group configs, KIP-848: `consumer.session.timeout.ms`,
`consumer.heartbeat.interval.ms`), one row per config a group sets, under Kafka's name, its value as
Kafka's protocol carries it (text). A group without a row takes the server's settings. Rows are
kept for a group id whether or not the group exists (Kafka sets them for a group not yet created),
and outlive its deletion, as Kafka keeps a group's configs until they are deleted.

A new table, empty: nothing to rewrite.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_configs",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "name"),
    )


def downgrade() -> None:
    op.drop_table("group_configs")
