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


def database_at(postgres, name: str, revision: str) -> str:
    """The URL of a fresh database migrated up to `revision` (what a node of that version left)."""
    postgres.create_database(name)
    url = database_url_for(postgres.database_url, name)
    command.upgrade(alembic_config(url), revision)
    return url


def rows(url: str, statement: str) -> list[tuple]:
    async def run():
        conn = await asyncpg.connect(url)
        try:
            return [tuple(row) for row in await conn.fetch(statement)]
        finally:
            await conn.close()

    return asyncio.run(run())


def test_0009_gives_every_existing_topic_its_own_topic_id(postgres):
    """Topics made before topic ids existed get one each at the upgrade, distinct and kept after."""
    url = database_at(postgres, "before_topic_ids", "0008")
    rows(
        url,
        "INSERT INTO topics (name, partition_count, config, is_internal) "
        "VALUES ('old-a', 1, '{}', false), ('old-b', 2, '{}', false)",
    )
    with_ids = "SELECT name, topic_uuid FROM topics ORDER BY name"
    command.upgrade(alembic_config(url), "head")
    upgraded = dict(rows(url, with_ids))
    assert set(upgraded) == {"old-a", "old-b"}
    assert None not in upgraded.values() and len(set(upgraded.values())) == 2
    command.upgrade(alembic_config(url), "head")  # again: nothing changes
    assert dict(rows(url, with_ids)) == upgraded


def test_0010_reads_offsets_committed_before_it_with_no_leader_epoch(postgres):
    """Offsets committed (and pending) before committed leader epochs were kept read back -1,
    Kafka's "no epoch"."""
    url = database_at(postgres, "before_leader_epochs", "0009")
    rows(
        url,
        "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms) "
        "VALUES ('old-group', 't', 0, 5, NULL, 1)",
    )
    rows(
        url,
        "INSERT INTO pending_txn_offsets (group_id, topic, partition, producer_id, producer_epoch, "
        "offsets_partition, committed_offset, metadata, commit_timestamp_ms) "
        "VALUES ('old-group', 't', 1, 7, 0, 3, 6, NULL, 1)",
    )
    command.upgrade(alembic_config(url), "head")
    assert rows(url, "SELECT partition, leader_epoch FROM group_offsets") == [(0, -1)]
    assert rows(url, "SELECT partition, leader_epoch FROM pending_txn_offsets") == [(1, -1)]
