"""The schema only changes through alembic: the migrated database matches the declared models, and
migrating is idempotent and safe from several processes at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel

from app.storage import tables  # noqa: F401
from app.storage.migrations import migration_engine
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
