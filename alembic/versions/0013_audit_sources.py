"""Each audit entry's source: the door the administrative action came through (`http`, `kafka`,
`console`), or `server` for what a node does itself at start (installing the admin token's key).
Before, an entry named the principal alone, so an ACL deleted over Kafka's DeleteAcls and one
deleted over HTTP were told apart by nothing.

Entries written before this revision have none (NULL: not recorded). A nullable column without a
default is a change of the catalog only: no table rewrite.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("source", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_log", "source")
