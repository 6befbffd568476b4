"""Producer state expires by the server's append time, not the client's record timestamp; committed
offsets remember the __consumer_offsets offset of the record that committed them, so the commit
appended last wins (Kafka's rule), whatever order transactional and plain commits settle in.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"


def upgrade() -> None:
    # Existing rows only know the record timestamp: start them from it (what expiry used until now).
    # Rows written without it (by hand, or by code that predates this column) are appended now.
    op.add_column("producer_states", sa.Column("last_append_ms", sa.BigInteger(), nullable=True))
    op.execute("UPDATE producer_states SET last_append_ms = last_timestamp_ms")
    op.alter_column("producer_states", "last_append_ms", nullable=False, server_default=sa.text(NOW_MS))
    op.create_index("producer_states_by_producer", "producer_states", ["producer_id", "last_append_ms"])
    # -1: committed before this revision, older than any record appended from now on.
    for table in ("group_offsets", "pending_txn_offsets"):
        op.add_column(table, sa.Column("record_offset", sa.BigInteger(), nullable=False, server_default="-1"))
    # A transactional offset pending now (its transaction still open) was committed after the plain
    # one it would replace unless their commit times say otherwise: 0 orders it after every -1, and
    # before every record appended from now on (its partition of __consumer_offsets holds its own
    # record, at 0 or later). Left at -1, like the committed offset, its transaction's COMMIT would
    # keep the older offset ("appended last wins" needs a later record), and the consumer would
    # read again, after the upgrade, inputs whose outputs that transaction committed.
    op.execute(
        "UPDATE pending_txn_offsets p SET record_offset = 0 WHERE NOT EXISTS ("
        "  SELECT 1 FROM group_offsets g WHERE g.group_id = p.group_id AND g.topic = p.topic "
        "    AND g.partition = p.partition AND g.commit_timestamp_ms > p.commit_timestamp_ms)"
    )


def downgrade() -> None:
    for table in ("group_offsets", "pending_txn_offsets"):
        op.drop_column(table, "record_offset")
    op.drop_index("producer_states_by_producer", table_name="producer_states")
    op.drop_column("producer_states", "last_append_ms")
