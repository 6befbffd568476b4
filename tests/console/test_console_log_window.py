"""The partition page's window of the log on a large or compacted partition, over real HTTP on real
PostgreSQL: a page reads the batches it shows, not every batch after it, and pages by the records
that are there, so a log the cleaner left sparse pages 50 records at a time, not 50 offsets (most of
them empty) at a time. The batches are written with SQL in the form the storage modules write them."""

from __future__ import annotations

import asyncio
import re

import asyncpg

from app.console.queries import log_browser
from tests.conftest import RunningServer

WINDOW = 50


async def _write_batches(database_url: str, topic: str, offsets: list[int]) -> int:
    """One single-record batch at each offset (the rest of the log empty, as compaction leaves it),
    the high watermark after the last; the topic's id."""
    conn = await asyncpg.connect(database_url)
    try:
        topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = $1", topic)
        await conn.execute(
            """INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id, producer_epoch,
                   base_sequence, is_transactional, control_type, first_timestamp_ms, max_timestamp_ms,
                   record_count, size_bytes, records)
            SELECT $1, 0, o, o, -1, -1, -1, false, NULL, 1700000000000, 1700000000000, 1, 40,
                   convert_to(json_build_array(json_build_array(1700000000000, 'k' || o, 'v' || o,
                       json_build_array(), 0))::text, 'UTF8')
            FROM unnest($2::bigint[]) o""",
            topic_id,
            offsets,
        )
        await conn.execute(
            "UPDATE partitions SET high_watermark = $2 WHERE topic_id = $1 AND partition = 0", topic_id, offsets[-1] + 1
        )
        await conn.execute("ANALYZE record_batches")
        return topic_id
    finally:
        await conn.close()


def _shown_offsets(page: str) -> list[int]:
    return [int(offset) for offset in re.findall(r'<tr id="o-(\d+)"', page)]


def _link(page: str, label: str) -> str | None:
    found = re.search(r'<a class="button small" href="([^"]+)"[^>]*>' + re.escape(label), page)
    return found.group(1).replace("&amp;", "&") if found else None


def test_a_window_reads_its_own_batches_not_the_rest_of_the_partition(module_server: RunningServer) -> None:
    """Regression: the window's query bounded the batches only by `last_offset >= start` (the
    index's key) and filtered `base_offset < end` row by row, so the oldest window of a partition
    read every batch of it: 20,000 here, a million on a real one, for a page of 50."""
    module_server.client.post("/v1/topics", json={"name": "long-log", "partitions": 1}).raise_for_status()

    async def tuples_read() -> tuple[int, list[int]]:
        topic_id = await _write_batches(module_server.database_url, "long-log", list(range(20_000)))
        conn = await asyncpg.connect(module_server.database_url)
        try:
            async with conn.transaction():
                entries = await log_browser.read_window(conn, topic_id, 0, 0, WINDOW)
                # This transaction's reads of the table, by sequential scan or through an index.
                read = await conn.fetchval(
                    "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
                    "WHERE relname = 'record_batches'"
                )
            return read, [e.offset for e in entries]
        finally:
            await conn.close()

    read, offsets = asyncio.run(tuples_read())
    assert offsets == list(range(WINDOW))
    assert read <= 2 * WINDOW, f"a window of {WINDOW} offsets read {read} batches of the partition"
    page = module_server.client.get("/console/topics/long-log/partitions/0?offset=0")
    assert _shown_offsets(page.text) == list(range(WINDOW))


def test_a_sparse_log_pages_by_the_records_it_holds(module_server: RunningServer) -> None:
    """Regression: a window was 50 offsets, so where compaction had left one record in a hundred
    offsets each page showed one record or none ("No offsets in this window"), and an operator
    clicked through 100 pages to see 50 records. A window is now the next 50 records from its start;
    "Older" goes back 50 records, and the tail shows the last 50."""
    module_server.client.post("/v1/topics", json={"name": "sparse-log", "partitions": 1}).raise_for_status()
    kept = list(range(0, 20_000, 100))  # 200 records, one per 100 offsets
    asyncio.run(_write_batches(module_server.database_url, "sparse-log", kept))
    client = module_server.client

    first = client.get("/console/topics/sparse-log/partitions/0?offset=0").text
    assert _shown_offsets(first) == kept[:WINDOW]
    assert "No offsets in this window" not in first
    newer = _link(first, "Newer")
    assert newer is not None
    second = client.get(newer).text
    assert _shown_offsets(second) == kept[WINDOW : 2 * WINDOW]
    older = _link(second, "‹ Older")
    assert older is not None
    assert _shown_offsets(client.get(older).text) == kept[:WINDOW]

    tail = client.get("/console/topics/sparse-log/partitions/0").text
    assert _shown_offsets(tail) == kept[-WINDOW:]
    assert "High watermark 19,901" in re.sub(r"<[^>]+>", "", tail)
    # An offset in a gap starts the window at the next record there is.
    assert _shown_offsets(client.get("/console/topics/sparse-log/partitions/0?offset=150").text) == kept[2 : 2 + WINDOW]
