"""Applies the alembic migrations (the only way txbroker's schema changes) to a database.

alembic and SQLAlchemy are imported by the functions that run migrations, not by this module: a
server starting on a database already at this code's revision (every restart but the first after
an upgrade) never needs them, and importing them took a large share of a node's start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from app.storage.database import connect_to_primary

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.ext.asyncio import AsyncEngine

# Any fixed 64-bit number distinct from the other advisory locks txbroker takes (see locks in storage).
MIGRATION_LOCK_KEY = 7_470_001

# The revision of alembic/versions' last migration: the schema this code is written for. A new
# migration updates it (tests/operations/test_start_up.py checks that it is alembic's head).
HEAD_REVISION = "0019"

REPO_ROOT = Path(__file__).resolve().parents[2]


class SchemaNewerThanCode(Exception):
    """The database's schema is at a revision none of this code's migrations has: a newer txbroker
    migrated it. Migrations only go forward, and what a newer one changed (a column's meaning, a
    key) is nothing this code knows how to read, so it must not serve that database."""

    def __init__(self, revisions: list[str]) -> None:
        super().__init__(
            f"the database's schema is at revision {', '.join(revisions)}, which this txbroker does not know: "
            f"its migrations end at {HEAD_REVISION}, so a newer txbroker has migrated the database, and this "
            f"older one cannot serve it. Run that newer txbroker (or a later one) instead; to go back to this "
            f"version, restore the database from a backup taken before the upgrade (docs/operations.md, "
            f'"Upgrades and migrations")'
        )


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
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    return create_async_engine(
        "postgresql+asyncpg://", async_creator=lambda: connect_to_primary(database_url), poolclass=NullPool
    )


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config

    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "alembic"))
    config.attributes["database_url"] = database_url
    return config


def upgrade_to_head(database_url: str) -> None:
    """Blocking; safe to run from several processes at once (alembic/env.py takes an advisory lock).
    Raises SchemaNewerThanCode for a database a newer txbroker migrated (alembic/env.py checks it
    under the lock, before any migration)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), "head")


def refuse_unknown_revisions(revisions: list[str]) -> None:
    """Raises SchemaNewerThanCode if a revision the database is at is none of alembic/versions'
    (alembic itself would only say that it cannot locate it). Loads alembic: for a database that is
    not at HEAD_REVISION, which is migrated next anyway."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config(""))
    known = {script.revision for script in scripts.walk_revisions()}
    unknown = [revision for revision in revisions if revision not in known]
    if unknown:
        raise SchemaNewerThanCode(unknown)


async def stored_revisions(database_url: str) -> list[str]:
    """The revisions alembic_version holds: [] for a database never migrated. A plain read, safe
    beside a migration under way in another process: alembic updates alembic_version in the
    transaction that migrates, so until that commits this reads the revision before it."""
    connection = await connect_to_primary(database_url)
    try:
        rows = await connection.fetch("SELECT version_num FROM alembic_version")
    except asyncpg.UndefinedTableError:  # never migrated
        return []
    finally:
        await connection.close()
    return [row["version_num"] for row in rows]


async def is_at_head(database_url: str) -> bool:
    """Whether the database's schema is at HEAD_REVISION, so that upgrade_to_head has nothing to do.
    A database behind it (or under a migration in another process: stored_revisions) is not: the
    caller runs upgrade_to_head, which waits for the migration's lock and then finds nothing left
    to do. Nor is a database ahead of this code (a newer node migrated it): upgrade_to_head refuses
    it with SchemaNewerThanCode."""
    return await stored_revisions(database_url) == [HEAD_REVISION]


async def check_not_newer(database_url: str) -> None:
    """Raises SchemaNewerThanCode for a database a newer txbroker migrated; returns for one at or
    behind this code's revision, or never migrated. `serve` asks before it serves, so that a node of
    an older version started on such a database stops with that message alone."""
    revisions = await stored_revisions(database_url)
    if revisions != [HEAD_REVISION]:
        refuse_unknown_revisions(revisions)
