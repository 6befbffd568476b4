"""SASL/SCRAM credentials (RFC 5802, Kafka's SCRAM-SHA-256 and SCRAM-SHA-512, KIP-84 and KIP-554):
one row per principal and mechanism, what a SCRAM server keeps: the salt, the iteration count, the
stored key and the server key, never the password nor the salted password. A credential belongs
to a principal (ACLs are by principal): it is deleted with it (ON DELETE CASCADE).

A new table, empty: nothing to rewrite.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scram_credentials",
        sa.Column("principal", sa.Text(), sa.ForeignKey("principals.name", ondelete="CASCADE"), nullable=False),
        sa.Column("mechanism", sa.Text(), nullable=False),
        sa.Column("salt", sa.LargeBinary(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("stored_key", sa.LargeBinary(), nullable=False),
        sa.Column("server_key", sa.LargeBinary(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("principal", "mechanism"),
    )


def downgrade() -> None:
    op.drop_table("scram_credentials")
