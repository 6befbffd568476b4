"""Alembic environment: migrations run over asyncpg, on the URL the caller puts in the config's
attributes (app/storage/migrations.py), serialized across server processes by an advisory lock."""

import asyncio

from sqlmodel import SQLModel

from alembic import context
from app.storage import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.storage.migrations import MIGRATION_LOCK_KEY, migration_engine, refuse_unknown_revisions

target_metadata = SQLModel.metadata


def run_migrations(connection) -> None:
    # Several `txbroker serve` processes may start at once against one database: the first to take
    # this lock migrates, the others wait and then find nothing left to do.
    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    context.configure(
        connection=connection, target_metadata=target_metadata, transaction_per_migration=False, compare_type=True
    )
    # A database a newer txbroker migrated: its message, not alembic's "Can't locate revision".
    refuse_unknown_revisions(list(context.get_context().get_current_heads()))
    with context.begin_transaction():
        context.run_migrations()


async def run_online() -> None:
    engine = migration_engine(context.config.attributes["database_url"])
    # One transaction for the lock and every pending migration (PostgreSQL's DDL is transactional):
    # an upgrade killed or failing midway leaves the database as it was, and the next runs them all.
    async with engine.begin() as connection:
        await connection.run_sync(run_migrations)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("txbroker migrations run online only: use `txbroker db upgrade`")
asyncio.run(run_online())
