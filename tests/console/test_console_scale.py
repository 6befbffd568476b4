"""The console at scale: 1,000 partitions, 10,000 transactional ids (1,000 of them Ongoing, each
pinning a partition's LSO; 100 Prepared), 2,000 consumer groups, one of them committed on every
partition, and a __transaction_state partition of 30,000 batches to page a history through. The
rows are written with SQL in the formats the storage modules write them, then every page is timed
over real HTTP (server-side rendering included) and in the browser. Prints the times; asserts only a
generous bound so the test is not flaky."""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from app.storage.database import connect
from app.storage.log.topics import TRANSACTION_STATE_TOPIC
from tests.conftest import RunningServer
from tests.console.test_console import Tab, chromium, playwright_driver  # noqa: F401 (a fixture)
from txbroker.wire import partition_for_key

PARTITIONS = 1_000
TRANSACTIONAL_IDS = 10_000
GROUPS = 2_000
LOG_BATCHES = 30_000
HISTORY_ID = "bulk-00000"
BOUND_S = 5.0
FIRST_PID = 100_000

# Per partition p of `wide`: offsets 0-4 a plain batch; 5-7 a transaction of producer
# FIRST_PID + 10p + 3 (epoch 2) committed by the marker at 8; 9-13 the open transaction of
# bulk-{10p} (producer FIRST_PID + 10p, epoch 3), which pins the LSO at 9. High watermark 14.
_BATCHES_SQL = """
INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id, producer_epoch, base_sequence,
    is_transactional, control_type, first_timestamp_ms, max_timestamp_ms, record_count, size_bytes, records)
SELECT $1, p, b.base, b.last, b.pid, b.epoch, b.seq, b.txn, b.control, $2, $2, b.last - b.base + 1, 40,
       CASE WHEN b.control IS NOT NULL THEN '\\x5b5d'::bytea WHEN b.last - b.base = 4 THEN $3::bytea ELSE $6::bytea END
FROM generate_series(0, $4 - 1) p,
LATERAL (VALUES (0, 4, -1::bigint, -1, -1, false, NULL::smallint),
                (5, 7, $5 + 10 * p + 3, 2, 0, true, NULL),
                (8, 8, $5 + 10 * p + 3, 2, -1, true, 1::smallint),
                (9, 13, $5 + 10 * p, 3, 0, true, NULL)) AS b(base, last, pid, epoch, seq, txn, control)
"""

# Each statement takes (topic_id, now, FIRST_PID, PARTITIONS, TRANSACTIONAL_IDS), so each names all five.
_SQL = [
    "UPDATE partitions SET high_watermark = 14 WHERE topic_id = $1 AND $2::bigint > 0 AND $3::bigint > 0 "
    "AND $4::int > 0 AND $5::int > 0",
    "INSERT INTO txn_markers (topic_id, partition, producer_id, producer_epoch, control_type, marker_offset, "
    "first_offset, timestamp_ms) SELECT $1, p, $3 + 10 * p + 3, 2, 1, 8, 5, $2 FROM generate_series(0, $4 - 1) p "
    "WHERE $5::int > 0",
    "INSERT INTO producer_states (topic_id, partition, producer_id, producer_epoch, last_sequence, last_timestamp_ms, "
    "last_append_ms, recent_batches, current_txn_first_offset) SELECT $1, p, $3 + 10 * p, 3, 4, $2, $2, '[]', 9 "
    "FROM generate_series(0, $4 - 1) p WHERE $5::int > 0",
    "INSERT INTO producer_ids (producer_id, producer_epoch, transactional_id, issued_ms) "
    "SELECT $3 + g, 3, 'bulk-' || lpad(g::text, 5, '0'), $2 FROM generate_series(0, $5 - 1) g "
    "WHERE $1::int > 0 AND $4::int > 0",
    # Every 10th id Ongoing (on partition g / 10, open for up to 10 min of its 15), ids 1, 101, ...
    # Prepared, every 10th + 2 CompleteAbort, the rest CompleteCommit.
    """INSERT INTO transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, txn_start_ms,
        last_update_ms, txn_producer_id, txn_producer_epoch, partitions, groups)
    SELECT 'bulk-' || lpad(g::text, 5, '0'), $3::bigint + g, 3, s.state, 900000,
           CASE WHEN s.open THEN $2::bigint - (g % 600) * 1000 ELSE -1 END, $2::bigint - g,
           CASE WHEN s.open THEN $3::bigint + g END, CASE WHEN s.open THEN 3 END,
           CASE WHEN s.open THEN jsonb_build_array(jsonb_build_array('wide', (g / 10) % $4::int, $1::int))
                ELSE '[]' END, '[]'
    FROM generate_series(0, $5 - 1) g,
    LATERAL (SELECT CASE WHEN g % 10 = 0 THEN 'Ongoing' WHEN g % 100 = 1 THEN 'Prepared'
                         WHEN g % 10 = 2 THEN 'CompleteAbort' ELSE 'CompleteCommit' END AS state) k,
    LATERAL (SELECT k.state, k.state IN ('Ongoing', 'Prepared') AS open) s""",
]


async def _bulk_load(database_url: str) -> None:
    now = int(time.time() * 1000)
    five, three = (orjson.dumps([[now, f"key-{i}", f"value {i}", [], 0] for i in range(n)]) for n in (5, 3))
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = 'wide'")
            await conn.execute(_BATCHES_SQL, topic_id, now, five, PARTITIONS, FIRST_PID, three)
            for sql in _SQL:
                await conn.execute(sql, topic_id, now, FIRST_PID, PARTITIONS, TRANSACTIONAL_IDS)
            await conn.execute(
                "INSERT INTO consumer_groups (group_id, generation_id, assignment, last_update_ms) "
                "SELECT 'group-' || lpad(g::text, 4, '0'), 1, '{}', $1 FROM generate_series(0, $2 - 1) g",
                now,
                GROUPS,
            )
            await conn.execute(
                "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, "
                "commit_timestamp_ms) SELECT 'group-0000', 'wide', p, 3, NULL, $1 FROM generate_series(0, $2 - 1) p",
                now,
                PARTITIONS,
            )
            await _long_transaction_log(conn, now)
    finally:
        await conn.close()


async def _long_transaction_log(conn, now: int) -> None:
    """LOG_BATCHES batches in HISTORY_ID's __transaction_state partition; only the 3 oldest and
    the 3 newest are HISTORY_ID's, so its history pages through every one of them."""
    log_topic = await conn.fetchrow(
        "SELECT topic_id, partition_count FROM topics WHERE name = $1", TRANSACTION_STATE_TOPIC
    )
    partition = partition_for_key(HISTORY_ID.encode(), log_topic["partition_count"])
    await conn.execute(
        """INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id, producer_epoch,
               base_sequence, is_transactional, control_type, first_timestamp_ms, max_timestamp_ms, record_count,
               size_bytes, records)
        SELECT $1, $2, g, g, -1, -1, -1, false, NULL, $3::bigint, $3::bigint, 1, 200,
               convert_to(json_build_array(json_build_array($3::bigint,
                   CASE WHEN g < 3 OR g >= $4::int - 3 THEN $5::text ELSE 'noise-' || g END,
                   json_build_object('state', CASE WHEN g % 3 = 0 THEN 'Ongoing' WHEN g % 3 = 1 THEN 'PrepareCommit'
                                              ELSE 'CompleteCommit' END,
                       'producer_id', $6::bigint, 'producer_epoch', g / 3, 'txn_producer_id', $6::bigint,
                       'txn_producer_epoch', g / 3, 'timeout_ms', 900000, 'txn_start_ms', $3::bigint,
                       'last_update_ms', $3::bigint,
                       'partitions', json_build_array(json_build_array('wide', 0)), 'groups', json_build_array())::text,
                   json_build_array(), 0))::text, 'UTF8')
        FROM generate_series(0, $4 - 1) g""",
        log_topic["topic_id"],
        partition,
        now,
        LOG_BATCHES,
        HISTORY_ID,
        FIRST_PID,
    )
    await conn.execute(
        "UPDATE partitions SET high_watermark = $3 WHERE topic_id = $1 AND partition = $2",
        log_topic["topic_id"],
        partition,
        LOG_BATCHES,
    )


def _time(client, path: str, runs: int = 3) -> tuple[float, float, float, int]:
    """(first, median) wall-clock seconds over HTTP, the median Server-Timing, and the size."""
    times, server_times = [], []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
        server_times.append(float(response.headers["server-timing"].partition("dur=")[2]) / 1000)
    return times[0], statistics.median(times), statistics.median(server_times), len(response.content)


def test_pages_render_fast_with_1000_partitions_and_10000_transactional_ids(make_server, playwright_driver) -> None:  # noqa: F811
    # No background work in the way: nothing here times out or expires during the test.
    server: RunningServer = make_server(abort_timed_out_transaction_interval_ms=3_600_000)
    server.client.post("/v1/topics", json={"name": "wide", "partitions": PARTITIONS}).raise_for_status()
    started = time.perf_counter()
    with ThreadPoolExecutor(1) as executor:  # asyncpg needs its own loop, away from Playwright's
        executor.submit(asyncio.run, _bulk_load(server.database_url)).result()
    loaded_s = time.perf_counter() - started
    assert (
        len(server.client.get("/v1/transactions", params={"state": "Ongoing", "limit": 10_000}).json()["transactions"])
        == TRANSACTIONAL_IDS // 10
    )

    pages = [
        "/console",
        "/console/topics/wide",
        "/console/topics/wide?after=899",
        "/console/topics/wide/partitions/0",
        "/console/topics/wide/partitions/999?offset=0",
        "/console/transactions",
        "/console/transactions?state=open",
        "/console/transactions?older_than=5m",
        "/console/transactions?prefix=bulk-099",
        "/console/transactions?after=bulk-05000",
        f"/console/transactions/{HISTORY_ID}",
        "/console/transactions/bulk-00010",
        "/console/groups",
        "/console/groups?after=group-1500",
        "/console/groups/group-0000",
    ]
    print(
        f"\nloaded {PARTITIONS} partitions, {TRANSACTIONAL_IDS} transactional ids, {GROUPS} groups and "
        f"{LOG_BATCHES} transaction-log batches in {loaded_s:.2f} s"
    )
    print(
        f"{'page (over HTTP: first, median of 3; server-side median)':<60} {'first':>8} {'median':>8} "
        f"{'server':>8} {'bytes':>9}"
    )
    slowest = 0.0
    for path in pages:
        first, median, server_side, size = _time(server.client, path)
        slowest = max(slowest, first, median)
        print(f"{path:<60} {first * 1000:>6.0f}ms {median * 1000:>6.0f}ms {server_side * 1000:>6.0f}ms {size:>9,}")

    history = server.client.get(f"/console/transactions/{HISTORY_ID}").text
    assert "Older »" in history, "the first page stops at the scan budget and offers the next"
    older = history.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    first, median, server_side, _ = _time(server.client, older)
    slowest = max(slowest, first, median)
    print(
        f"{'(history, older page) ' + older:<60} {first * 1000:>6.0f}ms {median * 1000:>6.0f}ms "
        f"{server_side * 1000:>6.0f}ms"
    )
    assert server.client.get(older).text.count("Ongoing") >= 1

    # Its own browser, closed before the server stops (a browser's idle keep-alive connections would
    # hold up the server's graceful shutdown).
    with chromium(playwright_driver) as context:
        tab = Tab(context)
        for name, path in (
            ("overview", "/console"),
            ("transactions", "/console/transactions?state=open"),
            ("topic", "/console/topics/wide"),
        ):
            started = time.perf_counter()
            tab.page.goto(f"{server.url}{path}", wait_until="load")
            loaded = time.perf_counter() - started
            slowest = max(slowest, loaded)
            print(f"{'(browser, until load) ' + path:<60} {loaded * 1000:>6.0f}ms")
            tab.shot(f"scale-{name}")
        tab.close()
    assert slowest < BOUND_S, f"the slowest page took {slowest:.2f} s"
