"""The schema only changes through alembic: the migrated database matches the declared models, and
migrating is idempotent and safe from several processes at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from alembic import command
from app.storage import tables  # noqa: F401
from app.storage.migrations import alembic_config, migration_engine
from tests.conftest import REPO_ROOT, database_url_for


def test_migrated_schema_matches_the_declared_tables(database_url):
    async def differences():
        engine = migration_engine(database_url)
        async with engine.connect() as connection:
            diff = await connection.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), SQLModel.metadata)
            )
        await engine.dispose()
        return diff

    assert asyncio.run(differences()) == []


def test_db_upgrade_command_from_several_processes_at_once(postgres):
    postgres.create_database("fresh_upgrade")
    url = database_url_for(postgres.database_url, "fresh_upgrade")
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "app.cli", "db", "upgrade", "--database-url", url],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    for run in runs:
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output.decode()
    again = subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade", "--database-url", url],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr.decode()


def test_0009_gives_every_existing_topic_its_own_topic_id(postgres):
    """Topics made before topic ids existed get one each at the upgrade, distinct and kept after."""
    postgres.create_database("before_topic_ids")
    url = database_url_for(postgres.database_url, "before_topic_ids")
    command.upgrade(alembic_config(url), "0008")

    async def topics_with_ids(insert: bool):
        conn = await asyncpg.connect(url)
        try:
            if insert:
                await conn.execute(
                    "INSERT INTO topics (name, partition_count, config, is_internal) "
                    "VALUES ('old-a', 1, '{}', false), ('old-b', 2, '{}', false)"
                )
                return None
            return dict(await conn.fetch("SELECT name, topic_uuid FROM topics ORDER BY name"))
        finally:
            await conn.close()

    asyncio.run(topics_with_ids(insert=True))
    command.upgrade(alembic_config(url), "head")
    upgraded = asyncio.run(topics_with_ids(insert=False))
    assert set(upgraded) == {"old-a", "old-b"}
    assert None not in upgraded.values() and len(set(upgraded.values())) == 2
    command.upgrade(alembic_config(url), "head")  # again: nothing changes
    assert asyncio.run(topics_with_ids(insert=False)) == upgraded
