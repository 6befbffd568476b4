"""Topic ids (KIP-516): a UUID per topic, Kafka's topic id, which Metadata v10+, Fetch v13+,
CreateTopics v7 and DeleteTopics v6 carry and HTTP shows as `topic_id`. Generated with the topic
and never changed: a topic deleted and re-created is a new row, so it gets a new id, and a client
still holding the old id gets UNKNOWN_TOPIC_ID instead of the new topic's records.

Existing topics get theirs here: gen_random_uuid() is volatile, so PostgreSQL evaluates the
default once per existing row (the ADD COLUMN rewrites the table, under its ACCESS EXCLUSIVE lock,
so no topic is created or read half-migrated).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "topics",
        sa.Column("topic_uuid", UUID(as_uuid=True), nullable=False, server_default=sa.text("gen_random_uuid()")),
    )
    op.create_unique_constraint("topics_topic_uuid_key", "topics", ["topic_uuid"])


def downgrade() -> None:
    op.drop_constraint("topics_topic_uuid_key", "topics", type_="unique")
    op.drop_column("topics", "topic_uuid")
