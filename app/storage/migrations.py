"""Applies the alembic migrations (the only way txbroker's schema changes) to a database."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from alembic import command
from app.storage.database import connect_to_primary

# Any fixed 64-bit number distinct from the other advisory locks txbroker takes (see locks in storage).
MIGRATION_LOCK_KEY = 7_470_001

REPO_ROOT = Path(__file__).resolve().parents[2]


def migration_engine(database_url: str) -> AsyncEngine:
    """A SQLAlchemy engine on the database (alembic speaks SQLAlchemy; the server speaks asyncpg
    directly). SQLAlchemy's URL parser refuses libpq's multi-host form (several ports), so the
    engine's URL names only the dialect and its connections come from the server's own connect,
    which finds the read-write host of the URL as the server's pool does."""
    scheme, sep, _rest = database_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise ValueError(
            f"database URL {database_url!r} is not a PostgreSQL URL: expected postgresql://user@host/db "
            f"or postgresql://user@host1:port1,host2:port2/db"
        )
    return create_async_engine(
        "postgresql+asyncpg://", async_creator=lambda: connect_to_primary(database_url), poolclass=NullPool
    )


def alembic_config(database_url: str) -> Config:
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "alembic"))
    config.attributes["database_url"] = database_url
    return config


def upgrade_to_head(database_url: str) -> None:
    """Blocking; safe to run from several processes at once (alembic/env.py takes an advisory lock)."""
    command.upgrade(alembic_config(database_url), "head")
