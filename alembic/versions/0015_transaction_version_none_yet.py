"""A transactional id's transaction version is NULL until one of its transactions is ended by an
EndTxn: the version is what its last EndTxn used (1: Kafka's EndTxn below v5, what librdkafka,
kafka-python and aiokafka send; 2: HTTP's and Kafka's EndTxn v5+), and an id that has not ended one
has none yet. Before, the column defaulted to 2, so a new id said 2 until its first EndTxn, although
a Kafka client's would end it with 1.

Existing rows: only an EndTxn wrote a value, but the default 2 cannot be told from an EndTxn's 2
in general, so a 2 is kept unless the row shows that no EndTxn of version 2 ended a transaction of
the id: its producer is at epoch 0 and it is Empty, Ongoing or Prepared (every transaction ended with
version 2 bumps the epoch, and before revision 0008 every one did; a decided or completed
transaction is kept, and any epoch above 0 may follow such an end). The one exception, a producer id
issued at epoch 0 once the previous one's 32,766 epochs ran out, reads NULL until its next EndTxn.
A 1 was always written by an EndTxn and stays. Catalog changes and an update of those rows only: no
table rewrite. Coordinator logic reads NULL as it read the default 2 (the epoch is bumped).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column(
        "transactions", "transaction_version", existing_type=sa.SmallInteger(), nullable=True, server_default=None
    )
    op.execute(
        "UPDATE transactions SET transaction_version = NULL "
        "WHERE transaction_version = 2 AND producer_epoch = 0 AND state IN ('Empty', 'Ongoing', 'Prepared')"
    )


def downgrade() -> None:
    # The schema before had no "none yet": an id with none reads 2 again, the default it had then.
    op.execute("UPDATE transactions SET transaction_version = 2 WHERE transaction_version IS NULL")
    op.alter_column(
        "transactions", "transaction_version", existing_type=sa.SmallInteger(), nullable=False, server_default="2"
    )
