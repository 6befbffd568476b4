"""The addresses each node advertises, one per Kafka listener (security protocol): Metadata,
FindCoordinator and DescribeCluster answered on a connection of protocol P give each live node's P
address (docs/kafka.md, "Several listeners"). Which nodes are alive stays PostgreSQL's sessions'
to say (app/storage/node_presence.py): a row here is read only for a node whose presence session
is live, so rows of nodes gone need no clean-up; a node rewrites its own when it announces itself.
The presence session's application_name keeps the first listener's address, which nodes of the
previous version (one listener, no table) read during a rolling upgrade.

A new table, empty: nothing to rewrite.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kafka_node_listeners",
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", "protocol"),
    )


def downgrade() -> None:
    op.drop_table("kafka_node_listeners")
