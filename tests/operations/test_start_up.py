"""What a node's start loads and does (docs/performance.md, "Start-up and restart"): a restart on a
database at this code's revision runs no migration machinery, and a server process imports neither
alembic nor any client (the SDK's, kafka-python); a database behind this code is still migrated at
the start."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys

import asyncpg
import pytest
from alembic.script import ScriptDirectory

import txbroker
from alembic import command
from app.storage.migrations import HEAD_REVISION, SchemaNewerThanCode, alembic_config, is_at_head
from tests.conftest import (
    REPO_ROOT,
    database_url_for,
    start_in_process_server,
    stop_in_process_server,
)

# Loaded only by the processes that run migrations (alembic, SQLAlchemy, SQLModel) or that are
# clients (the SDK's clients and httpx; kafka-python, whose package loads its whole client).
NOT_FOR_SERVING = ("alembic", "sqlalchemy", "sqlmodel", "httpx", "txbroker.sync", "txbroker.admin", "kafka")


def loaded_by(code: str) -> list[str]:
    """Which of NOT_FOR_SERVING a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {NOT_FOR_SERVING!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout.split()


def test_a_server_process_imports_no_migration_machinery_and_no_sdk_client():
    assert loaded_by("import app.cli, app.server") == []


def test_txbroker_serve_loads_no_client_command():
    """`txbroker serve` goes through the SDK's command line (the `txbroker` command), which offers the
    server's commands without the client commands' modules."""
    assert loaded_by("from txbroker.cli import _installed_command_parser\n_installed_command_parser('serve')") == []


def test_head_revision_is_alembics_head():
    head = ScriptDirectory.from_config(alembic_config("postgresql://unused/")).get_current_head()
    assert HEAD_REVISION == head, (
        f"app/storage/migrations.py says HEAD_REVISION = {HEAD_REVISION!r}, alembic/versions' head is "
        f"{head!r}: a new migration sets HEAD_REVISION to its revision"
    )


def set_revision(url: str, revision: str) -> None:
    async def update() -> None:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute("UPDATE alembic_version SET version_num = $1", revision)
        finally:
            await connection.close()

    asyncio.run(update())


def revisions(url: str) -> list[str]:
    async def read() -> list[str]:
        connection = await asyncpg.connect(url)
        try:
            return [row["version_num"] for row in await connection.fetch("SELECT version_num FROM alembic_version")]
        finally:
            await connection.close()

    return asyncio.run(read())


def test_is_at_head_only_at_this_codes_revision(postgres, database_url):
    assert asyncio.run(is_at_head(database_url))
    set_revision(database_url, "9999")  # a newer node migrated it
    assert not asyncio.run(is_at_head(database_url))
    postgres.create_database("never_migrated")
    assert not asyncio.run(is_at_head(database_url_for(postgres.database_url, "never_migrated")))
    postgres.create_database("one_behind")
    behind = database_url_for(postgres.database_url, "one_behind")
    command.upgrade(alembic_config(behind), "0009")
    assert not asyncio.run(is_at_head(behind))


def test_a_server_started_on_a_database_behind_this_code_migrates_it(postgres):
    postgres.create_database("behind_at_start")
    url = database_url_for(postgres.database_url, "behind_at_start")
    command.upgrade(alembic_config(url), "0009")
    running = start_in_process_server(url)
    try:
        assert running.client.get("/v1/topics").status_code == 200
    finally:
        stop_in_process_server(running)
    assert revisions(url) == [HEAD_REVISION]


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_refuses_a_database_a_newer_txbroker_migrated(postgres, workers):
    """A node of an older txbroker (the code downgraded) stops with a message saying what happened and
    what to do, whether it serves alone or with workers, instead of the start-up's traceback of
    alembic's "Can't locate revision"; its exit code says it refused (2): a restart is no help."""
    name = f"newer_for_{workers}_workers"
    postgres.create_database(name)
    url = database_url_for(postgres.database_url, name)
    command.upgrade(alembic_config(url), "head")
    set_revision(url, "9999")
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--database-url", url, "--port", "0", "--kafka-listener", "off"]
        + ["--workers", str(workers)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert f"txbroker: {SchemaNewerThanCode(['9999'])}\n" in result.stderr
    assert "Can't locate revision" not in result.stderr  # alembic's words, at the end of a traceback
    assert revisions(url) == ["9999"]


def test_every_public_name_of_the_sdk_is_imported_when_named():
    """txbroker/__init__.py imports its clients when named (the server imports txbroker.wire alone):
    each name of __all__ has a module, and is that module's object."""
    assert sorted(txbroker._MODULE_OF) == sorted(txbroker.__all__)
    for name, module in txbroker._MODULE_OF.items():
        assert getattr(txbroker, name) is getattr(importlib.import_module(module), name)
