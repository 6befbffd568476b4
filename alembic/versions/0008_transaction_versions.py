"""Transaction versions: Kafka clients' classic transactions (transaction version 1, EndTxn below
v5) keep their epoch from one transaction to the next, so (partition, producer id, epoch) no longer
names one transaction. A marker is keyed by its offset instead, and found per producer by offset
(the first marker of a producer after a batch is the one that ended the batch's transaction). The
transactions row records the version of the transaction's end, for the console.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("txn_markers_pkey", "txn_markers", type_="primary")
    op.drop_index("txn_markers_by_offset", table_name="txn_markers")
    op.create_primary_key("txn_markers_pkey", "txn_markers", ["topic_id", "partition", "marker_offset"])
    op.create_index("txn_markers_by_producer", "txn_markers", ["topic_id", "partition", "producer_id", "marker_offset"])
    # Every transaction before this revision ended with an epoch bump (version 2).
    op.add_column(
        "transactions", sa.Column("transaction_version", sa.SmallInteger(), nullable=False, server_default="2")
    )


def downgrade() -> None:
    op.drop_column("transactions", "transaction_version")
    op.drop_index("txn_markers_by_producer", table_name="txn_markers")
    op.drop_constraint("txn_markers_pkey", "txn_markers", type_="primary")
    # Back to one marker per (partition, producer id, epoch): fails if version-1 transactions left
    # several, which that schema cannot hold.
    op.create_primary_key("txn_markers_pkey", "txn_markers", ["topic_id", "partition", "producer_id", "producer_epoch"])
    op.create_index("txn_markers_by_offset", "txn_markers", ["topic_id", "partition", "marker_offset"])
