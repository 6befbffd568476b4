"""Each audit entry's client address: the peer the door's connection came from, HOST:PORT as the
door saw it (`[v6]:PORT` for IPv6): the HTTP request's TCP peer (no X-Forwarded-For header is
trusted: behind a reverse proxy, the proxy's), the Kafka connection's, the console request's.
Before, an entry named the principal and the door only, so an operator could not tell which
machine deleted a topic or an ACL, which Kafka's authorizer log tells.

Entries written before this revision, and those a node writes itself (source `server`), have none
(NULL). A nullable column without a default is a change of the catalog only: no table rewrite.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("client_address", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("audit_log", "client_address")
