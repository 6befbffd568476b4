"""Alembic environment: migrations run over asyncpg, on the URL the caller puts in the config's
attributes (app/storage/migrations.py), serialized across server processes by an advisory lock."""

import asyncio

from sqlmodel import SQLModel

from alembic import context
from app.storage import tables  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.storage.migrations import MIGRATION_LOCK_KEY, migration_engine

target_metadata = SQLModel.metadata


def run_migrations(connection) -> None:
    # Several `txbroker serve` processes may start at once against one database: the first to take
    # this lock migrates, the others wait and then find nothing left to do.
    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    context.configure(
        connection=connection, target_metadata=target_metadata, transaction_per_migration=False, compare_type=True
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_online() -> None:
    engine = migration_engine(context.config.attributes["database_url"])
    async with engine.begin() as connection:
        await connection.run_sync(run_migrations)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("txbroker migrations run online only: use `txbroker db upgrade`")
asyncio.run(run_online())
