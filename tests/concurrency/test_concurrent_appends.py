"""Concurrency of the partition log, with real connections interleaved: one partition's appends
queue on its row and keep offsets dense and unique; other partitions never wait for them."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import httpx
import pytest

from app.storage.database import connect
from app.storage.log import partition_log, record_codec, topics
from app.storage.log.append import BatchAppend, append_batch


def _batch(values: list[str]) -> record_codec.EncodedBatch:
    return record_codec.encode_batch([record_codec.TextRecord(None, v) for v in values], "utf8", 0, "test")


def test_concurrent_writers_to_one_partition_get_dense_unique_offsets(server):
    server.client.post("/v1/topics", json={"name": "busy", "partitions": 1}).raise_for_status()
    acknowledged: dict[int, str] = {}
    lock = threading.Lock()

    def writer(number: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for sequence in range(40):
                values = [f"w{number}-{sequence}-{i}" for i in range(3)]
                entry = client.post(
                    "/v1/produce",
                    json={
                        "producer_id": -1,
                        "partitions": [{"topic": "busy", "partition": 0, "records": [{"value": v} for v in values]}],
                    },
                ).json()["partitions"][0]
                assert entry["error"] is None
                assert entry["last_offset"] - entry["base_offset"] == 2
                with lock:
                    for i, value in enumerate(values):
                        assert entry["base_offset"] + i not in acknowledged, "an offset was given twice"
                        acknowledged[entry["base_offset"] + i] = value

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(acknowledged) == list(range(8 * 40 * 3))
    body = server.client.get("/v1/topics/busy/partitions/0/records", params={"offset": 0, "max_records": 10_000}).json()
    assert {r["offset"]: r["value"] for r in body["records"]} == acknowledged
    assert body["high_watermark"] == 8 * 40 * 3


def test_an_open_append_blocks_its_partition_but_not_others(database_url):
    """Session A appends to partition 0 and keeps its transaction open. Session B's append to
    partition 1 commits at once; session C's append to partition 0 waits for A (lock_timeout)."""

    async def scenario() -> None:
        a, b, c = [await connect(database_url) for _ in range(3)]
        try:
            topic = await topics.create_topic(a, "locks", 2, {})
            holder = a.transaction()
            await holder.start()
            first = await append_batch(a, BatchAppend(topic, 0, _batch(["a"])))
            assert first.base_offset == 0
            other = await append_batch(b, BatchAppend(topic, 1, _batch(["b"])))
            assert other.base_offset == 0
            await c.execute("SET lock_timeout = '300ms'")
            with pytest.raises(asyncpg.exceptions.LockNotAvailableError):
                await append_batch(c, BatchAppend(topic, 0, _batch(["c"])))
            await holder.commit()
            after = await append_batch(c, BatchAppend(topic, 0, _batch(["c"])))
            assert after.base_offset == 1, "the waiting append takes the next offset after the holder's"
        finally:
            for connection in (a, b, c):
                await connection.close()

    asyncio.run(scenario())


def test_an_uncommitted_append_is_invisible_and_leaves_no_hole(database_url):
    """A reader never sees a batch before its high watermark, and a rolled-back append leaves no gap."""

    async def scenario() -> None:
        writer, reader = await connect(database_url), await connect(database_url)
        try:
            topic = await topics.create_topic(writer, "rollback", 1, {})
            transaction = writer.transaction()
            await transaction.start()
            await append_batch(writer, BatchAppend(topic, 0, _batch(["doomed"])))
            state = await partition_log.partition_state(reader, topic, 0)
            assert state.high_watermark == 0
            await transaction.rollback()
            await append_batch(writer, BatchAppend(topic, 0, _batch(["kept"])))
            read = await partition_log.read(reader, topic, 0, 0, 10, "read_uncommitted", "utf8")
            assert [(r["offset"], r["value"]) for r in read.records] == [(0, "kept")]
        finally:
            await writer.close()
            await reader.close()

    asyncio.run(scenario())


def test_a_long_poll_on_one_server_wakes_when_another_server_appends(make_server):
    """Two server processes' worth of apps on one database: the append on B reaches the fetch
    waiting on A through PostgreSQL NOTIFY, long before A's fallback re-read would."""
    waiting_on, writing_to = make_server(long_poll_fallback_ms=20_000), make_server()
    waiting_on.client.post("/v1/topics", json={"name": "crossing", "partitions": 1}).raise_for_status()
    result: dict = {}

    def poll():
        with httpx.Client(base_url=waiting_on.url, timeout=30) as client:
            started = time.monotonic()
            result["body"] = client.post(
                "/v1/fetch",
                json={"max_wait_ms": 15_000, "partitions": [{"topic": "crossing", "partition": 0, "offset": 0}]},
            ).json()
            result["elapsed"] = time.monotonic() - started

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    writing_to.client.post("/v1/topics/crossing/records", json={"partition": 0, "records": [{"value": "hi"}]})
    poller.join()
    assert [r["value"] for r in result["body"]["partitions"][0]["records"]] == ["hi"]
    assert result["elapsed"] < 10, "woken by the other server's NOTIFY, not by a timer (20 s fallback)"
