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
from app.storage.migrations import HEAD_REVISION, SchemaNewerThanCode, alembic_config, migration_engine, upgrade_to_head
from tests.conftest import REPO_ROOT, database_url_for, start_in_process_server, stop_in_process_server


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


# Transactional ids as revision 0014 left them (transaction_version 2 by default, 1 only where an
# EndTxn below v5 wrote it): (id, state, producer_epoch, transaction_version) -> the version after 0015.
_NOW_MS = "EXTRACT(EPOCH FROM now())::bigint * 1000"
_VERSIONS_AT_0014 = {
    ("fresh", "Empty", 0, 2): None,  # initialized, never re-initialized: no EndTxn of version 2 ended one
    ("first-open", "Ongoing", 0, 2): None,
    ("first-prepared", "Prepared", 0, 2): None,
    ("reinitialized", "Empty", 3, 2): 2,  # epochs above 0 may follow an EndTxn of version 2: kept
    ("http-open", "Ongoing", 5, 2): 2,
    ("decided", "PrepareCommit", 0, 2): 2,  # only an EndTxn decides a commit
    ("rolled-over", "CompleteCommit", 0, 2): 2,  # a new producer id after 32,766 epochs
    ("classic", "Ongoing", 0, 1): 1,  # an EndTxn below v5 wrote it
    ("classic-done", "CompleteAbort", 4, 1): 1,
}


def test_0015_an_id_no_end_txn_of_version_2_ended_a_transaction_of_has_no_version_yet(postgres):
    """Revision 0015 makes the version NULL until an EndTxn ends one of the id's transactions. Of the
    rows before it, those whose state shows no EndTxn of version 2 behind them get NULL; the others
    keep theirs. The server then answers null for those, and ends their transactions as before."""
    url = database_at(postgres, "before_versions_none_yet", "0014")
    for (transactional_id, state, epoch, version), _ in _VERSIONS_AT_0014.items():
        rows(
            url,
            "INSERT INTO transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, "
            "  txn_start_ms, last_update_ms, partitions, groups, transaction_version) "
            f"VALUES ('{transactional_id}', 1000, {epoch}, '{state}', 60000, {_NOW_MS}, {_NOW_MS}, '[]', '[]', "
            f"  {version})",
        )
    versions = "SELECT transactional_id, transaction_version FROM transactions"
    command.upgrade(alembic_config(url), "head")
    expected = {transactional_id: after for (transactional_id, *_), after in _VERSIONS_AT_0014.items()}
    assert dict(rows(url, versions)) == expected
    assert rows(
        url,
        "SELECT is_nullable, column_default FROM information_schema.columns WHERE column_name = 'transaction_version'",
    ) == [("YES", None)]
    # No worker aborts, expires or finishes anything meanwhile (but the start finishes `decided`).
    running = start_in_process_server(
        url, abort_timed_out_transaction_interval_ms=3_600_000, remove_expired_transaction_interval_ms=3_600_000
    )
    try:
        described = running.client.get("/v1/transactions/fresh")
        assert described.status_code == 200 and described.json()["transaction_version"] is None, described.text
    finally:
        stop_in_process_server(running)

    command.downgrade(alembic_config(url), "0014")  # what revision 0014 said: 2 by default
    assert dict(rows(url, versions)) == {transactional_id: after or 2 for transactional_id, after in expected.items()}


# The rows of an open transaction that committed offsets, as the code of revision 0004 wrote them
# (a4ceff9: TransactionLog.save, group_offsets.commit and group_offsets.stage), its internal topics
# with one partition each. Transaction "eos" of producer 1003 added __consumer_offsets-0 for group
# "g" and committed offsets of "in" there, pending until its COMMIT marker: partition 0's at 12:00:02,
# after the group's plain commit of 12:00:01; partition 1's at 12:00:02, before the group's plain
# commit of 12:00:03, which therefore stays (the commit appended last wins, as in Kafka).
_TOPIC_CONFIG_AT_0004 = '{"retention_ms": -1, "retention_bytes": -1, "max_message_bytes": 1048576}'
_OPEN_TRANSACTION_AT_0004 = (
    "INSERT INTO topics (topic_id, name, partition_count, config, is_internal) VALUES "
    f"(1, '__transaction_state', 1, '{_TOPIC_CONFIG_AT_0004}', true), "
    f"(2, '__consumer_offsets', 1, '{_TOPIC_CONFIG_AT_0004}', true), "
    f"(3, 'in', 2, '{_TOPIC_CONFIG_AT_0004}', false)",
    "INSERT INTO partitions (topic_id, partition, high_watermark) VALUES (1, 0, 0), (2, 0, 4), (3, 0, 10), (3, 1, 10)",
    "INSERT INTO producer_ids (producer_id, producer_epoch, transactional_id, issued_ms) "
    "VALUES (1003, 0, 'eos', 1795780800000)",
    "INSERT INTO transactions (transactional_id, producer_id, producer_epoch, txn_producer_id, txn_producer_epoch, "
    "  state, timeout_ms, txn_start_ms, last_update_ms, partitions, groups) "
    "VALUES ('eos', 1003, 0, 1003, 0, 'Ongoing', 600000, EXTRACT(EPOCH FROM now())::bigint * 1000, "
    "  EXTRACT(EPOCH FROM now())::bigint * 1000, '[[\"__consumer_offsets\", 0, 2]]', '[\"g\"]')",
    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_timestamp_ms) "
    "VALUES ('g', 'in', 0, 2, 'plain', 1795780801000), ('g', 'in', 1, 9, 'plain, later', 1795780803000)",
    "INSERT INTO pending_txn_offsets (group_id, topic, partition, producer_id, producer_epoch, offsets_partition, "
    "  committed_offset, metadata, commit_timestamp_ms) "
    "VALUES ('g', 'in', 0, 1003, 0, 0, 7, 'eos', 1795780802000), ('g', 'in', 1, 1003, 0, 0, 4, 'eos', 1795780802000)",
)


def test_0005_an_open_transactions_offsets_replace_those_committed_before_them_at_its_commit(postgres):
    """A consume-transform-produce loop stopped for the upgrade with its transaction open commits it
    after: the group's offsets are those the transaction committed, unless a plain commit came after
    them. Revision 0005 gave both offsets -1 as their record's offset, and the COMMIT kept the older
    one, so the loop would read again inputs whose outputs it had committed."""
    url = database_at(postgres, "open_transaction_at_0004", "0004")
    for statement in _OPEN_TRANSACTION_AT_0004:
        rows(url, statement)
    running = start_in_process_server(url, transaction_log_partitions=1, offsets_partitions=1)
    try:
        end = running.client.post(
            "/v1/txn/end", json={"transactional_id": "eos", "producer_id": 1003, "producer_epoch": 0, "committed": True}
        )
        assert end.status_code == 200, end.text
        fetched = running.client.post("/v1/groups/g/offsets/fetch", json={}).json()["offsets"]
    finally:
        stop_in_process_server(running)
    assert [(o["partition"], o["offset"], o["metadata"]) for o in fetched] == [(0, 7, "eos"), (1, 9, "plain, later")]


def test_db_upgrade_refuses_a_database_a_newer_txbroker_migrated(postgres):
    """An older txbroker's `db upgrade` on a database a newer one migrated (the code downgraded) says
    so and what to do, instead of alembic's traceback, and leaves the database as it is."""
    url = database_at(postgres, "migrated_by_a_newer_txbroker", "head")
    rows(url, "UPDATE alembic_version SET version_num = '9999'")
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade", "--database-url", url],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"txbroker: {SchemaNewerThanCode(['9999'])}\n"
    assert rows(url, "SELECT version_num FROM alembic_version") == [("9999",)]


def test_an_upgrade_killed_midway_leaves_the_database_as_it_was_and_the_next_one_finishes_it(postgres):
    """Every pending migration runs in one transaction (docs/operations.md): `db upgrade` killed
    while migration 0007 waits for record_batches (after 0005 and 0006 ran) leaves the database at
    0004, none of their changes made, and the next upgrade applies them all."""
    url = database_at(postgres, "killed_upgrade", "0004")
    rows(url, "INSERT INTO topics (name, partition_count, config, is_internal) VALUES ('kept', 1, '{}', false)")

    async def kill_the_upgrade_midway() -> None:
        holder, watcher = await asyncpg.connect(url), await asyncpg.connect(url)
        try:
            async with holder.transaction():
                await holder.execute("LOCK TABLE record_batches IN ACCESS SHARE MODE")  # 0007 alters it
                upgrade = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "app.cli", "db", "upgrade", "--database-url", url, cwd=REPO_ROOT
                )
                # Out of any transaction: pg_stat_activity is read once per transaction.
                waits_on_the_lock = (
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE record_batches%'"
                )
                for _ in range(600):
                    if await watcher.fetchval(waits_on_the_lock):
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the upgrade never reached migration 0007")
                upgrade.kill()
                await upgrade.wait()
        finally:
            await holder.close()
            await watcher.close()

    asyncio.run(kill_the_upgrade_midway())
    assert rows(url, "SELECT version_num FROM alembic_version") == [("0004",)]
    assert rows(url, "SELECT to_regclass('partition_cleanups')") == [(None,)]  # 0006's
    upgrade_to_head(url)
    assert rows(url, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]
    assert rows(url, "SELECT name, config->>'cleanup_policy' FROM topics") == [("kept", "delete")]
