"""Security: principals, their API keys (stored hashed), Kafka-style ACLs, the audit log, and the
principal that created each transactional id (for the per-principal quota).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "principals",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("is_super_user", sa.Boolean(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text(), primary_key=True),
        sa.Column("principal", sa.Text(), sa.ForeignKey("principals.name", ondelete="CASCADE"), nullable=False),
        sa.Column("token_sha256", sa.LargeBinary(), nullable=False, unique=True),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "acls",
        sa.Column("acl_id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("resource_type", sa.Text(), nullable=False),
        sa.Column("pattern_type", sa.Text(), nullable=False),
        sa.Column("resource_name", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("permission", sa.Text(), nullable=False),
        sa.UniqueConstraint(
            "principal",
            "resource_type",
            "pattern_type",
            "resource_name",
            "operation",
            "permission",
            name="acls_unique_rule",
        ),
    )
    op.create_table(
        "audit_log",
        sa.Column("entry_id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=False),
    )
    op.add_column("transactions", sa.Column("principal", sa.Text(), nullable=True))
    op.create_index("transactions_by_principal", "transactions", ["principal"])


def downgrade() -> None:
    op.drop_index("transactions_by_principal", table_name="transactions")
    op.drop_column("transactions", "principal")
    op.drop_table("audit_log")
    op.drop_table("acls")
    op.drop_table("api_keys")
    op.drop_table("principals")
