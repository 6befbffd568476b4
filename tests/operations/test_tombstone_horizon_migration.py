"""Migration 0007 (compaction's delete horizon, KIP-534): tombstones that compaction kept before the
upgrade start their delete_retention_ms at the upgrade, whatever their record timestamps say."""

from __future__ import annotations

import asyncio
import time

from alembic import command
from app.storage.database import connect, create_pool
from app.storage.lifecycle import log_cleaner
from app.storage.log import record_codec
from app.storage.migrations import alembic_config, upgrade_to_head
from tests.conftest import database_url_for

DAY_MS = 86_400_000


def now_ms() -> int:
    return int(time.time() * 1000)


def test_tombstones_kept_before_the_upgrade_start_their_delete_horizon_at_the_upgrade(postgres):
    postgres.create_database("upgrade_to_delete_horizon")
    url = database_url_for(postgres.database_url, "upgrade_to_delete_horizon")
    command.upgrade(alembic_config(url), "0006")
    two_days_ago = now_ms() - 2 * DAY_MS
    tombstone = record_codec.encode_batch([record_codec.TextRecord("k", None, (), two_days_ago)], "utf8", 0, "t")
    fresh = record_codec.encode_batch([record_codec.TextRecord("j", "v")], "utf8", now_ms(), "t")

    async def before_the_upgrade() -> int:
        conn = await connect(url)
        try:
            topic_id = await conn.fetchval(
                "INSERT INTO topics (name, partition_count, config, is_internal) VALUES ('kept', 1, $1::jsonb, false) "
                "RETURNING topic_id",
                {"cleanup_policy": "compact", "delete_retention_ms": DAY_MS},  # the pool codes jsonb
            )
            await conn.execute(
                "INSERT INTO partitions (topic_id, partition, high_watermark) VALUES ($1, 0, 2)", topic_id
            )
            for offset, batch in ((0, tombstone), (1, fresh)):
                await conn.execute(
                    "INSERT INTO record_batches (topic_id, partition, last_offset, base_offset, producer_id, "
                    "producer_epoch, base_sequence, is_transactional, first_timestamp_ms, max_timestamp_ms, "
                    "record_count, size_bytes, records) VALUES ($1, 0, $2, $2, -1, -1, -1, false, $3, $3, 1, $4, $5)",
                    topic_id,
                    offset,
                    batch.first_timestamp_ms,
                    batch.size_bytes,
                    batch.payload,
                )
            # The last compaction (0006's rules) saw offset 0 and kept its tombstone: not yet two days old then.
            await conn.execute(
                "INSERT INTO partition_cleanups (topic_id, partition, compacted_through, oldest_tombstone_ms) "
                "VALUES ($1, 0, 1, $2)",
                topic_id,
                two_days_ago,
            )
            return topic_id
        finally:
            await conn.close()

    topic_id = asyncio.run(before_the_upgrade())
    upgraded_from = now_ms()
    upgrade_to_head(url)
    upgraded_by = now_ms()

    async def clean_and_read(at_ms: int) -> tuple[list, int | None]:
        pool = await create_pool(url, 2)
        try:
            await log_cleaner.clean(pool, at_ms, 1000)
            async with pool.acquire() as conn:
                batches = await conn.fetch(
                    "SELECT last_offset, tombstones_seen_ms FROM record_batches WHERE topic_id = $1 "
                    "ORDER BY last_offset",
                    topic_id,
                )
                earliest = await conn.fetchval(
                    "SELECT earliest_tombstone_seen_ms FROM partition_cleanups WHERE topic_id = $1", topic_id
                )
            return [tuple(batch) for batch in batches], earliest
        finally:
            await pool.close()

    batches, earliest = asyncio.run(clean_and_read(upgraded_by))
    [(first, stamped), (second, unstamped)] = batches
    assert (first, second, unstamped) == (0, 1, None)  # the tombstone stays; what compaction never saw is unstamped
    assert upgraded_from <= stamped <= upgraded_by and upgraded_from <= earliest <= upgraded_by
    batches, _ = asyncio.run(clean_and_read(stamped + DAY_MS))
    assert [offset for offset, _ in batches] == [1]  # a day after the upgrade, it goes
