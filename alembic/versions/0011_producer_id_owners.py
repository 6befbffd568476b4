"""Producer id owners: the principal an idempotent producer id was issued to, so that only it may
bump the id's epoch (KIP-360's InitProducerId with the current id and epoch). Without it any
authenticated caller could bump another principal's producer, fencing it everywhere, by naming its
id and epoch (ids are issued in sequence). NULL: issued to a super user, with auth off, to a
transactional id (whose Write ACL guards it), or before this migration; such an id is bumped for a
super user only, any other caller getting a new id, as Kafka answers every idempotent
InitProducerId.

A nullable column without a default is a change of the catalog only: no table rewrite.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("producer_ids", sa.Column("principal", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("producer_ids", "principal")
