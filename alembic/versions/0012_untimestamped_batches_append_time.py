"""The append time of a batch whose records have no timestamp (all -1, Kafka's NO_TIMESTAMP, which
only a Kafka client sends): retention_ms and compaction's min_compaction_lag_ms go by it for such a
batch, as Kafka's go by a segment's last-modified time when its records have no timestamp; the batch
was deleted and compacted at once before. NULL for every other batch, which goes by its records'
newest timestamp.

Batches appended before this revision have none: they go as before. A nullable column without a
default is a change of the catalog only: no table rewrite.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("record_batches", sa.Column("untimestamped_appended_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("record_batches", "untimestamped_appended_ms")
