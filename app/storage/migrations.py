"""Applies the alembic migrations (the only way txbroker's schema changes) to a database."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

from alembic import command

# Any fixed 64-bit number distinct from the other advisory locks txbroker takes (see locks in storage).
MIGRATION_LOCK_KEY = 7_470_001

REPO_ROOT = Path(__file__).resolve().parents[2]


def sqlalchemy_url(database_url: str) -> str:
    """The same database as a SQLAlchemy asyncpg URL (alembic speaks SQLAlchemy; the server speaks
    asyncpg directly)."""
    scheme, sep, rest = database_url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ValueError(f"database URL {database_url!r} is not a PostgreSQL URL: expected postgresql://user@host/db")
    return f"postgresql+asyncpg://{rest}"


def alembic_config(database_url: str) -> Config:
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "alembic"))
    config.attributes["database_url"] = database_url
    return config


def upgrade_to_head(database_url: str) -> None:
    """Blocking; safe to run from several processes at once (alembic/env.py takes an advisory lock)."""
    command.upgrade(alembic_config(database_url), "head")
