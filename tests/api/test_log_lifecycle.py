"""The log's lifecycle over real HTTP and real PostgreSQL: retention by time and size, DeleteRecords,
compaction, the rows of deleted topics and dead producer ids, and the invariants that hold through
all of them (docs/api.md, "Consuming"; storage/lifecycle/log_cleaner.py): offsets never change, nothing at or past
the LSO is deleted, read_committed stays exact at every offset >= the log start.

The servers here run the cleaner's background worker rarely; the tests run a cleaner pass
themselves (`clean`), as the worker would, so each step is deterministic. One test checks the
worker itself.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.storage.database import connect, create_pool
from app.storage.lifecycle import log_cleaner, log_compaction
from app.storage.log.partition_log import MARKER_BATCH_BYTES
from tests.api.test_transactions import TxnProducer

RARELY = 3_600_000


def clean(server, chunk: int = 1000, now_ms: int | None = None) -> log_cleaner.CleanupTotals:
    """One cleaner run against the server's database, as the background worker does it; `now_ms`:
    the cleaner's clock (default: now), to run it as if later."""

    async def run():
        pool = await create_pool(server.database_url, 2)
        try:
            return await log_cleaner.clean(pool, int(time.time() * 1000) if now_ms is None else now_ms, chunk)
        finally:
            await pool.close()

    return asyncio.run(run())


def sql(database_url: str, query: str, *args) -> list:
    async def run():
        conn = await connect(database_url)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def topic_id(server, name: str) -> int:
    return sql(server.database_url, "SELECT topic_id FROM topics WHERE name = $1", name)[0]["topic_id"]


def stored_batches(server, name: str, partition: int = 0) -> int:
    return sql(
        server.database_url,
        "SELECT count(*) AS n FROM record_batches WHERE topic_id = $1 AND partition = $2",
        topic_id(server, name),
        partition,
    )[0]["n"]


def create(client: httpx.Client, name: str, partitions: int = 1, **config) -> dict:
    response = client.post("/v1/topics", json={"name": name, "partitions": partitions, "config": config})
    assert response.status_code == 201, response.text
    return response.json()


def produce(client: httpx.Client, topic: str, records: list[dict], partition: int = 0) -> dict:
    entry = client.post(
        "/v1/produce",
        json={"producer_id": -1, "partitions": [{"topic": topic, "partition": partition, "records": records}]},
    ).json()["partitions"][0]
    assert entry["error"] is None, entry
    return entry


def fetch(client: httpx.Client, topic: str, offset: int, isolation: str = "read_committed", partition: int = 0) -> dict:
    return client.post(
        "/v1/fetch",
        json={
            "isolation_level": isolation,
            "max_records": 10_000,
            "partitions": [{"topic": topic, "partition": partition, "offset": offset}],
        },
    ).json()["partitions"][0]


def log_start(client: httpx.Client, topic: str, partition: int = 0) -> int:
    return client.get(f"/v1/topics/{topic}").json()["partitions"][partition]["log_start_offset"]


def earliest(client: httpx.Client, topic: str, partition: int = 0) -> int:
    return client.post(
        "/v1/offsets/list", json={"partitions": [{"topic": topic, "partition": partition, "timestamp": -2}]}
    ).json()["partitions"][0]["offset"]


def delete_records(client: httpx.Client, topic: str, offsets: dict[int, int]) -> httpx.Response:
    return client.post(
        f"/v1/topics/{topic}/delete-records",
        json={"partitions": [{"partition": partition, "offset": offset} for partition, offset in offsets.items()]},
    )


def send_keyed(producer: TxnProducer, topic: str, records: list[dict], partition: int = 0) -> None:
    sequence = producer.sequences.get((topic, partition), 0)
    response = producer.client.post(
        "/v1/produce",
        json={
            **producer.ids(),
            "partitions": [{"topic": topic, "partition": partition, "base_sequence": sequence, "records": records}],
        },
    )
    assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text
    producer.sequences[(topic, partition)] = sequence + len(records)


class HeldCleaner:
    """A cleaner run (as `clean` does it) held at a row the test locks, and a connection of the
    test's own (`reader`) to read while it is held; `async with HeldCleaner(url) as rig`."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    async def __aenter__(self) -> HeldCleaner:
        self.pool = await create_pool(self.database_url, 2)
        self.reader, self.holder = await connect(self.database_url), await connect(self.database_url)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.reader.close()
        await self.holder.close()
        await self.pool.close()

    async def hold(self, lock_query: str, *args, waits_in: str, chunk: int) -> None:
        """Locks the row `lock_query` selects (FOR UPDATE, in a transaction of its own), starts the
        run, and returns once its statement containing `waits_in` waits for that row. (Polled from
        `reader`, outside the holder's transaction, whose view of pg_stat_activity stays as first read.)"""
        self.holding = self.holder.transaction()
        await self.holding.start()
        await self.holder.execute(lock_query, *args)
        self.cleaner = asyncio.create_task(log_cleaner.clean(self.pool, int(time.time() * 1000), chunk))
        while not await self.reader.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE $1",
            f"%{waits_in}%",
        ):
            assert not self.cleaner.done(), self.cleaner
            await asyncio.sleep(0.01)

    async def release(self) -> log_cleaner.CleanupTotals:
        """Frees the row and awaits the end of the run."""
        await self.holding.rollback()
        return await self.cleaner


@pytest.fixture
def server(make_server):
    return make_server(log_cleaner_interval_ms=RARELY)


@pytest.fixture
def client(server) -> httpx.Client:
    return server.client


# ---- retention


def test_retention_by_time_deletes_old_batches_and_moves_the_log_start(server, client):
    create(client, "aged", retention_ms=60_000)
    old = int(time.time() * 1000) - 120_000
    for batch in range(3):
        produce(client, "aged", [{"value": f"old-{batch}-{i}", "timestamp_ms": old} for i in range(2)])
    produce(client, "aged", [{"value": "new-0"}, {"value": "new-1"}])
    assert stored_batches(server, "aged") == 4

    clean(server)

    assert log_start(client, "aged") == 6
    assert earliest(client, "aged") == 6
    assert stored_batches(server, "aged") == 1
    below = fetch(client, "aged", 0)
    assert below["error"]["code"] == "OFFSET_OUT_OF_RANGE" and below["log_start_offset"] == 6
    assert [(r["offset"], r["value"]) for r in fetch(client, "aged", 6)["records"]] == [(6, "new-0"), (7, "new-1")]
    clean(server)  # nothing more is old: a second run changes nothing
    assert log_start(client, "aged") == 6 and stored_batches(server, "aged") == 1


def test_a_retention_changed_during_a_cleaner_run_applies_to_the_partitions_it_cleans_after(server, client):
    """The cleaner read every topic's config once, when its run began, and applied it to each
    partition however much later it got there: a retention raised (here to forever) while a run was
    busy with another partition (another worker's or node's run, or this one's) still deleted by the
    old one, records the operator had just asked to keep. Here the run is held on the first
    topic's partition (a row lock) while the second topic's retention is raised."""
    from app.coordinator import topic_admin
    from app.coordinator.audit import Actor, AuditSource

    old = int(time.time() * 1000) - 120_000
    for name in ("busy", "raised"):  # "busy" first: the run takes partitions in topic id order
        create(client, name, retention_ms=60_000)
        produce(client, name, [{"value": "old", "timestamp_ms": old}])
        produce(client, name, [{"value": "new"}])
    busy = topic_id(server, "busy")

    async def run() -> None:
        pool = await create_pool(server.database_url, 2)
        watcher, holder = await connect(server.database_url), await connect(server.database_url)
        try:
            holder_transaction = holder.transaction()
            await holder_transaction.start()
            await holder.execute("SELECT 1 FROM partitions WHERE topic_id = $1 AND partition = 0 FOR UPDATE", busy)
            cleaner = asyncio.create_task(log_cleaner.clean(pool, int(time.time() * 1000), 1000))
            while not await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ):
                assert not cleaner.done(), cleaner
                await asyncio.sleep(0.01)
            await topic_admin.alter_config(
                pool,
                Actor("test", AuditSource.KAFKA),
                "raised",
                lambda config: {**config, "retention_ms": -1},
                {},
                "retention_ms=-1",
            )
            await holder_transaction.rollback()
            await cleaner
        finally:
            await watcher.close()
            await holder.close()
            await pool.close()

    asyncio.run(run())
    assert log_start(client, "busy") == 1, "the run went on once the row was free"
    assert log_start(client, "raised") == 0 and stored_batches(server, "raised") == 2
    assert [r["value"] for r in fetch(client, "raised", 0)["records"]] == ["old", "new"]


def test_retention_by_size_deletes_the_oldest_batches_while_at_least_the_limit_remains(server, client):
    create(client, "sized", retention_bytes=25)
    for batch in range(5):
        produce(client, "sized", [{"value": f"{batch}" * 10}])  # 10 bytes a batch
    clean(server)  # 50 bytes: without batches 0 and 1, 30 remain; without batch 2 too, 20 (< 25)
    assert log_start(client, "sized") == 2
    assert [r["value"] for r in fetch(client, "sized", 2)["records"]] == ["2" * 10, "3" * 10, "4" * 10]
    assert stored_batches(server, "sized") == 3


def test_retention_by_size_never_deletes_the_last_batch(server, client):
    # Issue 22: one acknowledged batch larger than retention_bytes emptied the log.
    create(client, "one-big", retention_bytes=1000)
    produce(client, "one-big", [{"value": "x" * 1500}])
    clean(server)
    assert log_start(client, "one-big") == 0 and stored_batches(server, "one-big") == 1
    assert [r["value"] for r in fetch(client, "one-big", 0)["records"]] == ["x" * 1500]
    produce(client, "one-big", [{"value": "y" * 600}])
    clean(server)  # without the first batch 600 bytes would remain, fewer than the limit: both stay
    assert log_start(client, "one-big") == 0 and stored_batches(server, "one-big") == 2
    produce(client, "one-big", [{"value": "z" * 500}])
    clean(server)  # now 1100 would remain: the first goes
    assert log_start(client, "one-big") == 1
    assert [r["value"] for r in fetch(client, "one-big", 1)["records"]] == ["y" * 600, "z" * 500]
    create(client, "zero", retention_bytes=0)
    for value in ("a", "b"):
        produce(client, "zero", [{"value": value}])
    clean(server)  # a limit of 0 keeps the newest batch still
    assert log_start(client, "zero") == 1
    assert [r["value"] for r in fetch(client, "zero", 1)["records"]] == ["b"]


def test_server_default_retention_applies_to_topics_created_without_one(make_server):
    server = make_server(log_cleaner_interval_ms=RARELY, log_retention_ms=1000, log_cleanup_policy="delete")
    config = create(server.client, "defaulted")["config"]
    assert config["retention_ms"] == 1000 and config["cleanup_policy"] == "delete"
    assert create(server.client, "explicit", retention_ms=-1)["config"]["retention_ms"] == -1


def test_retention_never_deletes_an_open_transaction(server, client):
    create(client, "racing", retention_ms=1)
    produce(client, "racing", [{"value": "before"}])
    producer = TxnProducer(client, "racer")
    producer.init()
    assert producer.send("racing", 0, "in-txn-1").status_code == 200
    produce(client, "racing", [{"value": "during"}])
    assert producer.send("racing", 0, "in-txn-2").status_code == 200
    time.sleep(0.01)  # every record is now older than retention_ms

    clean(server)
    assert log_start(client, "racing") == 1  # the LSO: the open transaction's first offset
    assert [r["value"] for r in fetch(client, "racing", 1, "read_uncommitted")["records"]] == [
        "in-txn-1",
        "during",
        "in-txn-2",
    ]
    assert delete_records(client, "racing", {0: 3}).json()["partitions"][0]["error"]["code"] == "OFFSET_OUT_OF_RANGE"

    producer.commit()
    assert [r["value"] for r in fetch(client, "racing", 1)["records"]] == ["in-txn-1", "during", "in-txn-2"]
    time.sleep(0.01)
    clean(server)
    assert log_start(client, "racing") == 5  # the high watermark, past the commit marker
    assert stored_batches(server, "racing") == 0


# ---- DeleteRecords


def test_delete_records_moves_the_log_start_and_the_cleaner_removes_the_batches(server, client):
    create(client, "trimmed", partitions=2)
    for _ in range(4):
        produce(client, "trimmed", [{"value": "a"}, {"value": "b"}])
    produce(client, "trimmed", [{"value": "p1"}], partition=1)

    answer = delete_records(client, "trimmed", {0: 3, 1: -1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["partitions"] == [
        {"partition": 0, "low_watermark": 3, "error": None},
        {"partition": 1, "low_watermark": 1, "error": None},
    ]
    # Visible at once: a fetch below the log start is out of range, earliest follows it, and a read
    # from the log start begins mid-batch.
    assert fetch(client, "trimmed", 2)["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    assert earliest(client, "trimmed") == 3
    assert [r["offset"] for r in fetch(client, "trimmed", 3)["records"]] == [3, 4, 5, 6, 7]
    # The log start never moves back; a retry answers the same.
    assert delete_records(client, "trimmed", {0: 1}).json()["partitions"][0]["low_watermark"] == 3

    clean(server)
    assert stored_batches(server, "trimmed") == 3  # the batch holding offset 3 stays
    assert stored_batches(server, "trimmed", 1) == 0


def test_delete_records_errors(client):
    create(client, "bounded")
    produce(client, "bounded", [{"value": "x"}])
    entries = delete_records(client, "bounded", {0: 2, 5: 0}).json()["partitions"]
    assert [e["error"]["code"] for e in entries] == ["OFFSET_OUT_OF_RANGE", "UNKNOWN_TOPIC_OR_PARTITION"]
    assert "high watermark 1" in entries[0]["error"]["message"]
    assert delete_records(client, "nowhere", {0: 0}).json()["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    internal = delete_records(client, "__consumer_offsets", {0: 0})
    assert internal.status_code == 400 and internal.json()["error"]["code"] == "INVALID_TOPIC_EXCEPTION"
    # As Kafka: a topic whose cleanup policy lacks delete keeps its records (compaction alone removes
    # them), each partition POLICY_VIOLATION, after its own check.
    for policy in ("compact", ""):
        create(client, f"bounded-{policy or 'none'}", cleanup_policy=policy)
        produce(client, f"bounded-{policy or 'none'}", [{"key": "k", "value": "x"}])
        entries = delete_records(client, f"bounded-{policy or 'none'}", {0: 1, 5: 0}).json()["partitions"]
        assert [e["error"]["code"] for e in entries] == ["POLICY_VIOLATION", "UNKNOWN_TOPIC_OR_PARTITION"]
        assert f"cleanup_policy (cleanup.policy) is {policy!r}" in entries[0]["error"]["message"]
        assert log_start(client, f"bounded-{policy or 'none'}") == 0
    for bad in (
        {"partitions": []},
        {"partitions": [{"partition": 0, "offset": -2}]},
        {"partitions": [{"partition": 0, "offset": "1"}]},
        {},
    ):
        response = client.post("/v1/topics/bounded/delete-records", json=bad)
        assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST", bad


def test_an_abort_marker_outlives_its_batches_while_a_fetch_in_flight_may_read_them(server, client):
    # Issue 22: the cleaner deleted, with its first chunk of batches below the log start, every
    # marker below it; an ABORT marker went while its aborted batch waited for a later chunk, and a
    # fetch that had checked the log start before DeleteRecords then showed that batch to
    # read_committed. Here the second chunk is held (a row lock on its first batch) while such a
    # fetch reads.
    from app.storage.log import partition_log, topics

    create(client, "in-flight")
    aborting = TxnProducer(client, "in-flight-aborting")
    aborting.init()
    aborting.send("in-flight", 0, "aborted-0")  # 0
    produce(client, "in-flight", [{"value": "plain-1"}])  # 1
    produce(client, "in-flight", [{"value": "plain-2"}])  # 2
    aborting.send("in-flight", 0, "aborted-3")  # 3
    aborting.abort()  # ABORT marker at 4
    produce(client, "in-flight", [{"value": "plain-5"}])  # 5
    topic = topic_id(server, "in-flight")

    async def run() -> list:
        async with HeldCleaner(server.database_url) as rig:
            info = await topics.get_topic(rig.reader, "in-flight")
            in_flight = await partition_log.partition_state(rig.reader, info, 0)  # the log start is 0 here
            assert delete_records(client, "in-flight", {0: 5}).status_code == 200
            # The first chunk (batches 0 and 1) is committed once the second waits for the held row.
            await rig.hold(
                "SELECT 1 FROM record_batches WHERE topic_id = $1 AND partition = 0 AND last_offset = 2 FOR UPDATE",
                topic,
                waits_in="DELETE FROM record_batches",
                chunk=2,
            )
            read = await partition_log.read(rig.reader, info, 0, 2, 100, "read_committed", "utf8", in_flight)
            await rig.release()
            return [(r["offset"], r["value"]) for r in read.records]

    assert asyncio.run(run()) == [(2, "plain-2"), (5, "plain-5")]
    # Once its batches are gone, the marker goes too.
    assert sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic) == []
    assert stored_batches(server, "in-flight") == 1


def test_compaction_keeps_an_abort_marker_whose_batch_a_racing_delete_records_left_below_the_log_start(server, client):
    # DeleteRecords moved the log start past an aborted batch after the cleaner had removed what was
    # below the old one, and before compaction read the partition: compaction, paging from the new
    # log start, never saw the batch and took the transaction's ABORT marker for one with nothing
    # left, while the batch waited for the next run. A fetch that had checked the log start before
    # DeleteRecords then showed the aborted record to read_committed. Here the cleaner's removal
    # below the first log start is held (a row lock on the partition's cleanup row) while
    # DeleteRecords moves it again.
    from app.storage.log import partition_log, topics

    create(client, "raced", cleanup_policy="compact,delete")  # DeleteRecords needs delete
    aborting = TxnProducer(client, "raced-aborting")
    aborting.init()
    produce(client, "raced", [{"key": "a", "value": "plain-0"}])  # 0
    send_keyed(aborting, "raced", [{"key": "b", "value": "aborted-1"}])  # 1
    aborting.abort()  # ABORT marker at 2
    produce(client, "raced", [{"key": "c", "value": "plain-3"}])  # 3
    assert delete_records(client, "raced", {0: 1}).json()["partitions"][0]["low_watermark"] == 1
    topic = topic_id(server, "raced")
    sql(server.database_url, "INSERT INTO partition_cleanups (topic_id, partition) VALUES ($1, 0)", topic)

    async def run() -> list:
        async with HeldCleaner(server.database_url) as rig:
            info = await topics.get_topic(rig.reader, "raced")
            in_flight = await partition_log.partition_state(rig.reader, info, 0)  # the log start is 1 here
            # The chunk that removed batch 0 waits to record itself, its DELETE done.
            await rig.hold(
                "SELECT 1 FROM partition_cleanups WHERE topic_id = $1 AND partition = 0 FOR UPDATE",
                topic,
                waits_in="UPDATE partition_cleanups",
                chunk=1000,
            )
            assert delete_records(client, "raced", {0: 2}).json()["partitions"][0]["low_watermark"] == 2
            await rig.release()
            read = await partition_log.read(rig.reader, info, 0, 1, 100, "read_committed", "utf8", in_flight)
            return [(r["offset"], r["value"]) for r in read.records]

    assert asyncio.run(run()) == [(3, "plain-3")]
    clean(server)
    assert sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic) == []
    assert [r["value"] for r in fetch(client, "raced", 2)["records"]] == ["plain-3"]


def test_read_committed_at_the_log_start_hides_an_aborted_transaction_whose_marker_is_gone(server, client):
    create(client, "mixed")
    aborting = TxnProducer(client, "aborting")
    aborting.init()
    aborting.send("mixed", 0, "aborted-0")  # offset 0
    produce(client, "mixed", [{"value": "plain-1"}])  # offset 1
    aborting.send("mixed", 0, "aborted-2")  # offset 2
    aborting.abort()  # ABORT marker at 3
    produce(client, "mixed", [{"value": "plain-4"}])  # offset 4

    # The log start inside the aborted transaction: its marker stays, its records stay hidden.
    delete_records(client, "mixed", {0: 1})
    clean(server)
    assert [r["value"] for r in fetch(client, "mixed", 1)["records"]] == ["plain-1", "plain-4"]
    markers = sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic_id(server, "mixed"))
    assert len(markers) == 1

    # Past the marker: the marker goes with the last of its transaction's batches.
    delete_records(client, "mixed", {0: 4})
    clean(server)
    assert sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic_id(server, "mixed")) == []
    assert [r["value"] for r in fetch(client, "mixed", 4)["records"]] == ["plain-4"]
    assert [r["value"] for r in fetch(client, "mixed", 4, "read_uncommitted")["records"]] == ["plain-4"]


def test_a_consumer_below_the_log_start_resets_per_auto_offset_reset(server, client):
    from txbroker import Consumer, TopicPartition

    create(client, "reset")
    for value in range(6):
        produce(client, "reset", [{"value": str(value)}])
    partition = TopicPartition("reset", 0)
    positions = {}
    for reset in ("earliest", "latest"):
        consumer = Consumer(url=server.url, group_id=None, auto_offset_reset=reset, enable_auto_commit=False)
        try:
            consumer.assign([partition])
            consumer.seek(partition, 1)
            delete_records(client, "reset", {0: 4})
            polled = []
            for _ in range(5):
                polled += consumer.poll(timeout_ms=200)
                if polled or consumer.position(partition) == 6:
                    break
            positions[reset] = ([r.value for r in polled], consumer.position(partition))
        finally:
            consumer.close()
    assert positions["earliest"] == ([b"4", b"5"], 6)
    assert positions["latest"] == ([], 6)
    from txbroker.errors import OffsetOutOfRangeError

    consumer = Consumer(url=server.url, group_id=None, auto_offset_reset="none", enable_auto_commit=False)
    try:
        consumer.assign([partition])
        consumer.seek(partition, 1)
        with pytest.raises(OffsetOutOfRangeError):
            for _ in range(5):
                consumer.poll(timeout_ms=200)
    finally:
        consumer.close()


# ---- compaction


def test_compaction_keeps_the_latest_committed_record_per_key_at_its_offset(server, client):
    # A compacted topic refuses keyless records; one it holds was written before it became
    # compacted (Kafka's IncrementalAlterConfigs; HTTP changes no config, so the row here).
    create(client, "table", cleanup_policy="delete", delete_retention_ms=0)
    produce(
        client,
        "table",
        [
            {"key": "k1", "value": "a"},
            {"key": "k2", "value": "b"},
            {"key": "k1", "value": "c"},
            {"key": None, "value": "no-key"},
        ],
    )  # 0..3
    sql(
        server.database_url,
        """UPDATE topics SET config = config || '{"cleanup_policy": "compact"}' WHERE name = $1""",
        "table",
    )
    writer = TxnProducer(client, "table-writer")
    writer.init()
    send_keyed(writer, "table", [{"key": "k3", "value": "aborted"}, {"key": "k2", "value": "aborted"}])  # 4, 5
    writer.abort()  # 6
    send_keyed(writer, "table", [{"key": "k3", "value": "committed"}])  # 7
    writer.commit()  # 8
    produce(client, "table", [{"key": "k4", "value": "gone"}])  # 9
    produce(client, "table", [{"key": "k4", "value": None}])  # 10: tombstone
    produce(client, "table", [{"key": "k1", "value": "d"}, {"key": "k5", "value": "e"}])  # 11, 12

    clean(server)

    kept = [(r["offset"], r["key"], r["value"]) for r in fetch(client, "table", 0, "read_uncommitted")["records"]]
    assert kept == [(1, "k2", "b"), (3, None, "no-key"), (7, "k3", "committed"), (11, "k1", "d"), (12, "k5", "e")]
    assert [(r["offset"], r["value"]) for r in fetch(client, "table", 0)["records"]] == [
        (1, "b"),
        (3, "no-key"),
        (7, "committed"),
        (11, "d"),
        (12, "e"),
    ]
    # Reading from an offset that compaction emptied continues at the next record kept.
    assert [r["offset"] for r in fetch(client, "table", 4)["records"]] == [7, 11, 12]
    # The aborted transaction left nothing: its batch and marker are gone; the committed one's
    # marker stays while its record does.
    markers = sql(
        server.database_url, "SELECT marker_offset FROM txn_markers WHERE topic_id = $1", topic_id(server, "table")
    )
    assert [m["marker_offset"] for m in markers] == [8]
    assert client.get("/v1/topics/table").json()["partitions"][0]["high_watermark"] == 13
    # A second run finds nothing new and changes nothing.
    before = sql(
        server.database_url,
        "SELECT last_offset, records FROM record_batches WHERE topic_id = $1 ORDER BY last_offset",
        topic_id(server, "table"),
    )
    assert clean(server).total() == 0
    after = sql(
        server.database_url,
        "SELECT last_offset, records FROM record_batches WHERE topic_id = $1 ORDER BY last_offset",
        topic_id(server, "table"),
    )
    assert before == after


def test_small_fetches_step_over_the_gaps_of_batches_compacted_away(server, client):
    # Compaction removes whole batches: a read whose window falls in such a gap continues at the
    # next batch kept, whatever its budget.
    create(client, "gappy", cleanup_policy="compact", delete_retention_ms=0)
    for round_number in range(3):
        for key in ("a", "b", "c"):
            produce(client, "gappy", [{"key": key, "value": f"{key}{round_number}-{i}"} for i in range(4)])
    produce(client, "gappy", [{"key": "d", "value": "d-last"}])  # 36
    clean(server)
    kept = [(r["offset"], r["value"]) for r in fetch(client, "gappy", 0)["records"]]
    assert kept == [(27, "a2-3"), (31, "b2-3"), (35, "c2-3"), (36, "d-last")]
    for max_records in (1, 2, 3):
        seen, offset = [], 0
        while offset < 37:
            entry = client.post(
                "/v1/fetch",
                json={"max_records": max_records, "partitions": [{"topic": "gappy", "partition": 0, "offset": offset}]},
            ).json()["partitions"][0]
            assert entry["records"], (max_records, offset, entry)
            seen += [(r["offset"], r["value"]) for r in entry["records"]]
            offset = entry["next_offset"]
        assert seen == kept, max_records


def test_a_page_that_takes_longer_than_the_idle_transaction_timeout_is_compacted(server, client, monkeypatch):
    """The request pool's idle_in_transaction_session_timeout ends a transaction whose process is
    silent between two statements (a hung node). Compaction decodes a page's batches in Python
    between its first statement and its writes, which on large batches takes longer: each run's
    transaction was ended, and that partition never compacted."""
    create(client, "slow-page", cleanup_policy="compact", delete_retention_ms=0)
    for value in ("old", "new", "newest"):
        produce(client, "slow-page", [{"key": "k", "value": value}])
    decode = log_compaction.record_codec.decode_payload

    def slow_decode(*args):
        time.sleep(0.3)  # the event loop busy, as decoding large batches keeps it
        return decode(*args)

    monkeypatch.setattr(log_compaction.record_codec, "decode_payload", slow_decode)

    async def run():
        pool = await create_pool(server.database_url, 2, idle_in_transaction_timeout_ms=100)
        try:
            return await log_cleaner.clean(pool, int(time.time() * 1000), 1000)
        finally:
            await pool.close()

    asyncio.run(run())
    assert [(r["offset"], r["value"]) for r in fetch(client, "slow-page", 0)["records"]] == [(2, "newest")]


def test_compaction_never_removes_the_last_batch_of_the_log(server, client):
    # A value and its tombstone (delete_retention_ms 0): the value goes, the tombstone would too, and
    # no batch would be left below the high watermark; a Kafka consumer there fetched nothing and its
    # position stayed short of the high watermark until something new came (Kafka never cleans its
    # active segment, so its log always ends in a batch). The last batch stays as written.
    create(client, "tail", cleanup_policy="compact", delete_retention_ms=0)
    produce(client, "tail", [{"key": "k", "value": "v"}])  # 0
    produce(client, "tail", [{"key": "k", "value": None}])  # 1: tombstone, the last batch
    clean(server)
    clean(server)
    assert stored_batches(server, "tail") == 1
    for isolation in ("read_committed", "read_uncommitted"):
        entry = fetch(client, "tail", 0, isolation)
        assert ([(r["offset"], r["value"]) for r in entry["records"]], entry["next_offset"]) == ([(1, None)], 2)
    # Not the last batch any more: the next run removes the tombstone (its delete horizon passed).
    produce(client, "tail", [{"key": "j", "value": "after"}])  # 2
    clean(server)
    assert [(r["offset"], r["value"]) for r in fetch(client, "tail", 0)["records"]] == [(2, "after")]
    assert stored_batches(server, "tail") == 1


def test_compaction_keeps_a_marker_that_ends_the_log_after_its_records_are_gone(server, client):
    # An aborted transaction's batch goes, and a committed one's tombstone expires; the marker that
    # ends the log stays (Kafka's cleaner keeps it too: it is in the active segment, and the last
    # entry of its producer), so that a reader steps over it to the high watermark.
    markers = "SELECT marker_offset FROM txn_markers WHERE topic_id = $1 ORDER BY marker_offset"
    for commit in (False, True):
        topic = f"marker-tail-{commit}"
        create(client, topic, cleanup_policy="compact", delete_retention_ms=0, min_cleanable_dirty_ratio=0)
        produce(client, topic, [{"key": "k", "value": "v"}])  # 0
        writer = TxnProducer(client, f"{topic}-writer")
        writer.init()
        send_keyed(writer, topic, [{"key": "k", "value": None if commit else "aborted"}])  # 1
        writer.commit() if commit else writer.abort()  # 2
        clean(server)
        clean(server)
        kept = [0, 2] if not commit else [2]  # k's value stays unless the committed tombstone superseded it
        batches = sql(
            server.database_url,
            "SELECT last_offset FROM record_batches WHERE topic_id = $1 ORDER BY last_offset",
            topic_id(server, topic),
        )
        assert [b["last_offset"] for b in batches] == kept, topic
        assert [m["marker_offset"] for m in sql(server.database_url, markers, topic_id(server, topic))] == [2]
        for isolation in ("read_committed", "read_uncommitted"):
            entry = fetch(client, topic, 1, isolation)
            assert (entry["records"], entry["next_offset"]) == ([], 3), (topic, isolation, entry)
        # Once a batch follows it, the marker goes with the rest of its transaction.
        produce(client, topic, [{"key": "j", "value": "after"}])  # 3
        clean(server)
        assert sql(server.database_url, markers, topic_id(server, topic)) == []
        assert [r["offset"] for r in fetch(client, topic, 0)["records"]] == [0, 3][commit:]


def test_a_read_in_a_range_that_compaction_emptied_before_the_lso_continues_there(server, client):
    # A value and its tombstone, both gone (delete_retention_ms 0), then a transaction still open: no
    # batch is left below the LSO. A read_committed read there must move on to it, or a reader (a
    # Spark range planned up to the LSO) would wait at the old offset for records that can never come.
    create(client, "emptied", cleanup_policy="compact", delete_retention_ms=0)
    produce(client, "emptied", [{"key": "k", "value": "v"}])  # 0
    produce(client, "emptied", [{"key": "k", "value": None}])  # 1
    writer = TxnProducer(client, "emptied-writer")
    writer.init()
    send_keyed(writer, "emptied", [{"key": "j", "value": "open"}])  # 2: the LSO, and the last batch
    clean(server)
    clean(server)
    assert stored_batches(server, "emptied") == 1
    for offset in (0, 1):
        entry = fetch(client, "emptied", offset)
        assert (entry["records"], entry["next_offset"], entry["last_stable_offset"]) == ([], 2, 2), entry
        entry = fetch(client, "emptied", offset, "read_uncommitted")
        assert [(r["offset"], r["value"]) for r in entry["records"]] == [(2, "open")], entry
    writer.commit()
    assert [(r["offset"], r["value"]) for r in fetch(client, "emptied", 0)["records"]] == [(2, "open")]


def test_compaction_keeps_tombstones_for_delete_retention_ms_and_stops_at_the_lso(server, client):
    create(client, "lazy", cleanup_policy="compact")  # tombstones stay a day
    produce(client, "lazy", [{"key": "k", "value": "v"}, {"key": "k", "value": None}])
    writer = TxnProducer(client, "lazy-writer")
    writer.init()
    send_keyed(writer, "lazy", [{"key": "j", "value": "open"}])  # offset 2, open: the LSO
    produce(client, "lazy", [{"key": "j", "value": "after"}])  # offset 3, past the LSO
    clean(server)
    assert [(r["offset"], r["value"]) for r in fetch(client, "lazy", 0, "read_uncommitted")["records"]] == [
        (1, None),
        (2, "open"),
        (3, "after"),
    ]
    writer.commit()
    clean(server)
    assert [(r["offset"], r["value"]) for r in fetch(client, "lazy", 0, "read_uncommitted")["records"]] == [
        (1, None),
        (3, "after"),
    ]


def test_a_tombstone_stays_delete_retention_ms_after_the_cleaner_first_saw_it_whatever_its_timestamp(server, client):
    # Issue 22: a tombstone whose record timestamp was two days old went at the next compaction
    # (delete_retention_ms 24 h): a consumer that had read the value never saw the delete.
    day = 86_400_000
    create(client, "late-deletes", cleanup_policy="compact", delete_retention_ms=day)
    two_days_ago = int(time.time() * 1000) - 2 * day
    produce(client, "late-deletes", [{"key": "k", "value": "v", "timestamp_ms": two_days_ago}])  # 0
    produce(client, "late-deletes", [{"key": "k", "value": None, "timestamp_ms": two_days_ago}])  # 1: tombstone
    produce(client, "late-deletes", [{"key": "other", "value": "stays"}])  # 2
    first_seen = int(time.time() * 1000)
    clean(server, now_ms=first_seen)

    def kept() -> list:
        return [(r["offset"], r["value"]) for r in fetch(client, "late-deletes", 0)["records"]]

    assert kept() == [(1, None), (2, "stays")]  # the value superseded, the tombstone kept
    clean(server, now_ms=first_seen + day - 1)
    assert kept() == [(1, None), (2, "stays")]
    clean(server, now_ms=first_seen + day)
    assert kept() == [(2, "stays")]
    assert stored_batches(server, "late-deletes") == 1


def test_internal_topics_are_compacted_so_their_size_follows_live_ids(server, client):
    config = client.get("/v1/topics/__transaction_state").json()["config"]
    assert config["cleanup_policy"] == "compact"
    create(client, "busy")
    producer = TxnProducer(client, "one-id")
    producer.init()
    for number in range(20):
        producer.send("busy", 0, f"v{number}")
        producer.commit()
    state_topic = topic_id(server, "__transaction_state")
    count = "SELECT count(*) AS n FROM record_batches WHERE topic_id = $1"
    assert sql(server.database_url, count, state_topic)[0]["n"] >= 40
    clean(server)
    # The latest record of the one live id is kept (its batch holds the transitions of one request).
    assert sql(server.database_url, count, state_topic)[0]["n"] == 1


# ---- deleted topics and dead ids


def test_deleting_a_topic_leaves_nothing_behind_after_a_cleaner_run(server, client):
    create(client, "doomed", partitions=2)
    producer = TxnProducer(client, "doomed-writer")
    producer.init()
    producer.send("doomed", 0, "x")
    producer.send("doomed", 1, "y")
    producer.commit()
    doomed = topic_id(server, "doomed")
    assert client.delete("/v1/topics/doomed").status_code == 204
    create(client, "doomed")  # a new topic of the same name never sees the old one's rows
    assert fetch(client, "doomed", 0)["records"] == []
    clean(server, chunk=1)
    for table in ("record_batches", "txn_markers", "producer_states", "partition_cleanups", "deleted_topics"):
        assert sql(server.database_url, f"SELECT 1 FROM {table} WHERE topic_id = $1", doomed) == [], table


def test_a_topic_deleted_while_a_cleaner_run_is_under_way_leaves_no_cleanup_row_behind(server, client):
    # A run lists its partitions first; one of a topic deleted meanwhile, whose rows another server's
    # run had already removed, got its cleanup row inserted again as the run reached it, and nothing
    # ever removed it. Here the run is held on an earlier topic while the later one is deleted and
    # a second run removes its rows.
    create(client, "held-first", retention_ms=1)
    create(client, "deleted-meanwhile", retention_ms=1)
    produce(client, "held-first", [{"value": "expired", "timestamp_ms": int(time.time() * 1000) - 60_000}])
    first, deleted = topic_id(server, "held-first"), topic_id(server, "deleted-meanwhile")

    async def run() -> None:
        async with HeldCleaner(server.database_url) as rig:
            # Retention's UPDATE of the first topic's log start waits for the held partition row.
            await rig.hold(
                "SELECT 1 FROM partitions WHERE topic_id = $1 AND partition = 0 FOR UPDATE",
                first,
                waits_in="UPDATE partitions SET log_start_offset",
                chunk=1000,
            )
            assert client.delete("/v1/topics/deleted-meanwhile").status_code == 204
            await asyncio.to_thread(clean, server)  # another server's run: the deleted topic's rows go
            assert await rig.reader.fetch("SELECT 1 FROM deleted_topics WHERE topic_id = $1", deleted) == []
            await rig.release()

    asyncio.run(run())
    assert log_start(client, "held-first") == 1
    assert sql(server.database_url, "SELECT 1 FROM partition_cleanups WHERE topic_id = $1", deleted) == []


def test_an_idempotent_retry_of_a_batch_retained_or_compacted_away_is_still_a_duplicate(server, client):
    # The producer's state (its last five batches) is its own rows, as Kafka keeps producer state
    # in snapshots apart from the segments (KIP-360): a batch gone from the log, to DeleteRecords
    # or to compaction, is still recognised when retried, and answered with its own offsets.
    from tests.api.test_transactions import init_idempotent

    def send(topic: str, sequence: int, key: str, value: str) -> dict:
        response = client.post(
            "/v1/produce",
            json={
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "partitions": [
                    {
                        "topic": topic,
                        "partition": 0,
                        "base_sequence": sequence,
                        "records": [{"key": key, "value": value}],
                    }
                ],
            },
        )
        assert response.status_code == 200, response.text
        return response.json()["partitions"][0]

    create(client, "trimmed-away")
    create(client, "compacted-away", cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    producer_id, epoch = init_idempotent(client)
    first = {topic: send(topic, 0, "k", "first") for topic in ("trimmed-away", "compacted-away")}
    for topic in ("trimmed-away", "compacted-away"):
        assert send(topic, 1, "k", "second")["error"] is None
    assert delete_records(client, "trimmed-away", {0: -1}).status_code == 200
    clean(server)
    assert stored_batches(server, "trimmed-away") == 0
    assert [r["value"] for r in fetch(client, "compacted-away", 0)["records"]] == ["second"]
    for topic in ("trimmed-away", "compacted-away"):
        retried = send(topic, 0, "k", "first")
        assert retried["duplicate"] is True, retried
        assert (retried["base_offset"], retried["last_offset"]) == (first[topic]["base_offset"], 0)
    assert [r["value"] for r in fetch(client, "compacted-away", 0)["records"]] == ["second"]
    assert fetch(client, "trimmed-away", 2)["records"] == []


def test_an_idempotent_producer_writes_on_to_a_topic_deleted_and_created_again_under_its_name(server, client):
    # The producer's state on the old topic went with it, and the new topic's partition had none:
    # its next sequence there was taken for a gap in a partition it had never written to, a fatal
    # OUT_OF_ORDER_SEQUENCE_NUMBER on every send. A topic created since its id was issued may be
    # such a one: it is answered UNKNOWN_PRODUCER_ID, and the SDK takes a new id and writes on.
    from txbroker import Producer

    create(client, "again")
    with Producer(url=server.url) as producer:
        for index in range(3):
            producer.send("again", value=f"old-{index}".encode(), partition=0).result(30)
        assert client.delete("/v1/topics/again").status_code == 204
        create(client, "again")
        offsets = [
            producer.send("again", value=f"new-{index}".encode(), partition=0).result(30).offset for index in range(3)
        ]
    assert offsets == [0, 1, 2]
    assert [r["value"] for r in fetch(client, "again", 0)["records"]] == ["new-0", "new-1", "new-2"]


def test_producer_ids_of_expired_transactional_ids_are_forgotten(make_server):
    server = make_server(
        log_cleaner_interval_ms=RARELY,
        transactional_id_expiration_ms=1,
        remove_expired_transaction_interval_ms=50,
        producer_id_expiration_ms=1,
        producer_id_expiration_check_interval_ms=50,
    )
    producer = TxnProducer(server.client, "short-lived")
    producer.init()
    issued = producer.producer_id
    deadline = time.monotonic() + 30
    while sql(server.database_url, "SELECT 1 FROM producer_ids WHERE producer_id = $1", issued):
        assert time.monotonic() < deadline, "the expired id's producer id was never forgotten"
        time.sleep(0.05)


def test_the_background_worker_applies_retention(make_server):
    server = make_server(log_cleaner_interval_ms=50)
    create(server.client, "worked", retention_ms=1)
    produce(server.client, "worked", [{"value": "x"}])
    deadline = time.monotonic() + 30
    while log_start(server.client, "worked") != 1 or stored_batches(server, "worked"):
        assert time.monotonic() < deadline, "the cleaner worker did not apply retention"
        time.sleep(0.05)
    cleanup = sql(
        server.database_url,
        "SELECT last_cleanup_ms, removed_batches FROM partition_cleanups WHERE topic_id = $1",
        topic_id(server, "worked"),
    )
    assert cleanup[0]["removed_batches"] == 1 and cleanup[0]["last_cleanup_ms"] is not None


def test_sdk_admin_delete_records(server, client):
    from txbroker import Admin, TopicPartition
    from txbroker.errors import OffsetOutOfRangeError

    create(client, "sdk-trim", partitions=2)
    produce(client, "sdk-trim", [{"value": "a"}, {"value": "b"}])
    with Admin(url=server.url) as admin:
        assert admin.delete_records({TopicPartition("sdk-trim", 0): 1, TopicPartition("sdk-trim", 1): -1}) == {
            TopicPartition("sdk-trim", 0): 1,
            TopicPartition("sdk-trim", 1): 0,
        }
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({TopicPartition("sdk-trim", 0): 5})
    assert earliest(client, "sdk-trim") == 1


def test_an_expired_transactional_id_leaves_a_tombstone_that_compaction_removes(make_server):
    server = make_server(
        log_cleaner_interval_ms=RARELY,
        transactional_id_expiration_ms=1,
        remove_expired_transaction_interval_ms=50,
        transaction_log_partitions=1,  # every id's records in one partition
    )
    producer = TxnProducer(server.client, "forgotten")
    producer.init()
    deadline = time.monotonic() + 30
    while server.client.get("/v1/transactions/forgotten").status_code != 404:
        assert time.monotonic() < deadline, "the transactional id never expired"
        time.sleep(0.05)
    state_topic = topic_id(server, "__transaction_state")
    count = "SELECT count(*) AS n FROM record_batches WHERE topic_id = $1"
    clean(server)
    assert sql(server.database_url, count, state_topic)[0]["n"] == 1  # the tombstone, for delete_retention_ms
    sql(
        server.database_url,
        "UPDATE topics SET config = config || '{\"delete_retention_ms\": 0}' WHERE topic_id = $1",
        state_topic,
    )
    clean(server)
    assert sql(server.database_url, count, state_topic)[0]["n"] == 1  # the log's last batch stays
    # Another id comes, and expires too (every id does within 50 ms here): once batches follow the
    # first tombstone it goes, with that id's record; that id's tombstone, the log's last batch, stays.
    TxnProducer(server.client, "remembered").init()
    while server.client.get("/v1/transactions/remembered").status_code != 404:
        assert time.monotonic() < deadline + 30, "the second transactional id never expired"
        time.sleep(0.05)
    clean(server)
    batches = sql(server.database_url, "SELECT last_offset FROM record_batches WHERE topic_id = $1", state_topic)
    end = sql(server.database_url, "SELECT high_watermark FROM partitions WHERE topic_id = $1", state_topic)
    assert [batch["last_offset"] for batch in batches] == [end[0]["high_watermark"] - 1]


def test_the_console_shows_log_start_retention_settings_and_the_last_cleanup(server, client):
    create(client, "shown", retention_ms=1, cleanup_policy="compact,delete")
    produce(client, "shown", [{"key": "k", "value": "v"}])
    produce(client, "shown", [{"key": "k", "value": "w"}])
    time.sleep(0.01)
    clean(server)
    topic_page = client.get("/console/topics/shown")
    assert topic_page.status_code == 200, topic_page.text
    assert "Last cleanup" in topic_page.text and "compact,delete" in topic_page.text
    partition_page = client.get("/console/topics/shown/partitions/0")
    assert partition_page.status_code == 200, partition_page.text
    text = partition_page.text
    assert "Log start" in text and "Last cleanup" in text and "2 batches removed" in text
    assert "retention_ms" in text and "delete_retention_ms" in text
    assert client.get("/console/topics/__consumer_offsets").status_code == 200


# ---- crashes

CRASH_BATCHES = 20_000  # enough that a run takes seconds, one chunk of 10 per PostgreSQL transaction
CRASH_KEYS = 50


def _write_batches(database_url: str, topic: int, count: int, keys: int) -> None:
    """`count` one-record batches, keys k0..k(keys-1) in turn, written with SQL in the format
    append.py writes them (faster than as many produce requests)."""
    sql(
        database_url,
        """
        WITH head AS (UPDATE partitions SET high_watermark = $2 WHERE topic_id = $1 AND partition = 0)
        INSERT INTO record_batches (topic_id, partition, base_offset, last_offset, producer_id, producer_epoch,
            base_sequence, is_transactional, control_type, first_timestamp_ms, max_timestamp_ms, record_count,
            size_bytes, records)
        SELECT $1, 0, o, o, -1, -1, -1, false, NULL, 0, 0, 1, 4,
               convert_to('[[0,"k' || (o % $3) || '","v' || o || '",[],0]]', 'UTF8')
        FROM generate_series(0, $2 - 1) AS o""",
        topic,
        count,
        keys,
    )


def _kill_when(server, database_url: str, condition, what: str) -> None:
    from tests.crash.test_transaction_crashes import _wait_for_other_backends_to_end

    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.002)
    server.kill()
    _wait_for_other_backends_to_end(database_url)


def test_a_crash_in_the_middle_of_retention_and_compaction_loses_nothing_and_the_run_finishes(
    database_url, server_process
):
    env = {"TXBROKER_LOG_CLEANER_INTERVAL_MS": "20", "TXBROKER_LOG_CLEANER_CHUNK_BATCHES": "10"}
    server = server_process("--database-url", database_url, env=env)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create(client, "crash-table", cleanup_policy="compact")  # cleaned first: the lower topic_id
        create(client, "crash-trim")
    ids = {
        name: sql(database_url, "SELECT topic_id FROM topics WHERE name = $1", name)[0]["topic_id"]
        for name in ("crash-trim", "crash-table")
    }
    _write_batches(database_url, ids["crash-trim"], CRASH_BATCHES, CRASH_BATCHES)
    _write_batches(database_url, ids["crash-table"], CRASH_BATCHES, CRASH_KEYS)
    count = "SELECT count(*) AS n FROM record_batches WHERE topic_id = $1"

    def batches(name: str) -> int:
        return sql(database_url, count, ids[name])[0]["n"]

    def nothing_lost() -> None:
        """Every batch from the log start on; the latest record of each key."""
        kept = sql(
            database_url,
            "SELECT min(last_offset) AS first, count(*) AS n FROM record_batches "
            "WHERE topic_id = $1 AND last_offset >= $2",
            ids["crash-trim"],
            CRASH_BATCHES // 2,
        )
        assert (kept[0]["first"], kept[0]["n"]) == (CRASH_BATCHES // 2, CRASH_BATCHES // 2)
        latest = sql(
            database_url,
            "SELECT last_offset FROM record_batches WHERE topic_id = $1 AND last_offset >= $2",
            ids["crash-table"],
            CRASH_BATCHES - CRASH_KEYS,
        )
        assert len(latest) == CRASH_KEYS

    # Killed in the middle of a compaction run.
    _kill_when(
        server,
        database_url,
        lambda: CRASH_KEYS * 2 < batches("crash-table") < CRASH_BATCHES - 100,
        "a compaction under way",
    )
    nothing_lost()

    # Killed in the middle of removing what DeleteRecords put below the log start.
    server = server_process("--database-url", database_url, env=env)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert delete_records(client, "crash-trim", {0: CRASH_BATCHES // 2}).status_code == 200
    _kill_when(
        server,
        database_url,
        lambda: CRASH_BATCHES // 2 + 100 < batches("crash-trim") < CRASH_BATCHES - 100,
        "a removal under way",
    )
    nothing_lost()

    server = server_process("--database-url", database_url, env=env)
    deadline = time.monotonic() + 120
    while batches("crash-trim") != CRASH_BATCHES // 2 or batches("crash-table") != CRASH_KEYS:
        assert time.monotonic() < deadline, "the cleaner did not finish after the restart"
        time.sleep(0.05)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        records = fetch(client, "crash-table", 0, "read_uncommitted")["records"]
        assert [(r["offset"], r["key"], r["value"]) for r in records] == [
            (offset, f"k{offset % CRASH_KEYS}", f"v{offset}")
            for offset in range(CRASH_BATCHES - CRASH_KEYS, CRASH_BATCHES)
        ]
        assert [r["offset"] for r in fetch(client, "crash-trim", CRASH_BATCHES // 2)["records"]] == list(
            range(CRASH_BATCHES // 2, CRASH_BATCHES)
        )


def test_a_crash_in_the_middle_of_compacting_transactions_keeps_read_committed_exact(database_url, server_process):
    # Compaction removes aborted batches, superseded records and the markers of transactions it
    # leaves nothing of, a page per PostgreSQL transaction. Killed with a page held (a row lock on
    # an aborted batch it removes), every batch still stored keeps its marker, read_committed shows
    # no aborted record and every key's latest committed one, and the next run finishes the job.
    server = server_process("--database-url", database_url, env={"TXBROKER_LOG_CLEANER_INTERVAL_MS": str(RARELY)})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create(client, "crash-txns", cleanup_policy="compact", delete_retention_ms=0)
        committing, aborting = TxnProducer(client, "crash-committing"), TxnProducer(client, "crash-aborting")
        committing.init()
        aborting.init()
        for round_ in range(6):  # five offsets a round: two transactions' batches, a plain one, two markers
            send_keyed(committing, "crash-txns", [{"key": f"k{round_ % 3}", "value": f"committed-{round_}"}])
            send_keyed(aborting, "crash-txns", [{"key": f"k{(round_ + 1) % 3}", "value": f"aborted-{round_}"}])
            produce(client, "crash-txns", [{"key": f"p{round_ % 2}", "value": f"plain-{round_}"}])
            committing.commit()
            aborting.abort()
    server.kill()
    topic = sql(database_url, "SELECT topic_id FROM topics WHERE name = 'crash-txns'")[0]["topic_id"]
    stored = "SELECT count(*) AS n FROM record_batches WHERE topic_id = $1"
    assert sql(database_url, stored, topic)[0]["n"] == 30
    latest = {"k0": "committed-3", "k1": "committed-4", "k2": "committed-5", "p0": "plain-4", "p1": "plain-5"}

    async def crash_with_a_page_held() -> None:
        # The watcher polls outside the holder's transaction, whose view of pg_stat_activity stays
        # as first read.
        holder, watcher = await connect(database_url), await connect(database_url)
        try:
            async with holder.transaction():
                # Round 3's aborted batch, at offset 16: pages of two batches, so [16, 17] waits.
                await holder.execute(
                    "SELECT 1 FROM record_batches WHERE topic_id = $1 AND last_offset = 16 FOR UPDATE", topic
                )
                cleaning = server_process(
                    "--database-url",
                    database_url,
                    env={"TXBROKER_LOG_CLEANER_INTERVAL_MS": "20", "TXBROKER_LOG_CLEANER_CHUNK_BATCHES": "2"},
                )
                deadline = time.monotonic() + 60
                while not await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM record_batches%ANY%'"
                ):
                    assert time.monotonic() < deadline, "compaction never reached the held page"
                    await asyncio.sleep(0.01)
                cleaning.kill()
                raise _Rollback
        except _Rollback:
            pass
        finally:
            await holder.close()
            await watcher.close()

    asyncio.run(crash_with_a_page_held())
    from tests.crash.test_transaction_crashes import _wait_for_other_backends_to_end

    _wait_for_other_backends_to_end(database_url)
    assert 11 < sql(database_url, stored, topic)[0]["n"] < 30  # pages before the held one were committed
    orphaned = sql(
        database_url,
        "SELECT b.last_offset FROM record_batches b WHERE b.topic_id = $1 AND b.is_transactional "
        "AND b.control_type IS NULL AND NOT EXISTS (SELECT 1 FROM txn_markers m WHERE m.topic_id = b.topic_id "
        "AND m.partition = b.partition AND m.producer_id = b.producer_id AND m.marker_offset > b.last_offset)",
        topic,
    )
    assert orphaned == [], "a transaction's batch outlived its marker"
    server = server_process("--database-url", database_url, env={"TXBROKER_LOG_CLEANER_INTERVAL_MS": str(RARELY)})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        values = [r["value"] for r in fetch(client, "crash-txns", 0)["records"]]
        assert not [value for value in values if value.startswith("aborted")], values
        assert set(latest.values()) <= set(values), values
    server.kill()

    server = server_process("--database-url", database_url, env={"TXBROKER_LOG_CLEANER_INTERVAL_MS": "20"})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        deadline = time.monotonic() + 60
        # 5 records, 3 markers of kept ones, and the ABORT marker that ends the log
        while sql(database_url, stored, topic)[0]["n"] != 9:
            assert time.monotonic() < deadline, "the cleaner did not finish after the restart"
            time.sleep(0.05)
        for isolation in ("read_committed", "read_uncommitted"):
            records = fetch(client, "crash-txns", 0, isolation)["records"]
            assert {r["key"]: r["value"] for r in records} == latest, isolation
            assert len(records) == len(latest)


class _Rollback(Exception):
    """Leaves a test's `async with conn.transaction()` by rolling it back."""


def test_delete_records_needs_delete_on_the_topic(make_server):
    from tests.api.test_security import ADMIN_TOKEN, new_user, rule

    server = make_server(auth="required", admin_token=ADMIN_TOKEN, log_cleaner_interval_ms=RARELY)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as admin:
        create(admin, "guarded")
        produce(admin, "guarded", [{"value": "x"}])
        writer = new_user(admin, "writer", rule("Topic", "guarded", "Write"), rule("Topic", "guarded", "Read"))
        deleter = new_user(admin, "deleter", rule("Topic", "guarded", "Delete"))
        with writer, deleter:
            refused = delete_records(writer, "guarded", {0: 1})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "TOPIC_AUTHORIZATION_FAILED"
            assert delete_records(deleter, "guarded", {0: 1}).json()["partitions"][0]["low_watermark"] == 1
        audit = admin.get("/v1/audit").json()
        assert any(
            entry["action"] == "delete records" and entry["principal"] == "deleter" for entry in audit["entries"]
        )


def test_list_offsets_by_time_never_answers_below_the_log_start(client):
    create(client, "timed")
    produce(client, "timed", [{"value": "a", "timestamp_ms": 5000}, {"value": "b", "timestamp_ms": 1000}])
    produce(client, "timed", [{"value": "c", "timestamp_ms": 6000}])
    delete_records(client, "timed", {0: 1})

    def by_time(timestamp: int) -> int:
        return client.post(
            "/v1/offsets/list", json={"partitions": [{"topic": "timed", "partition": 0, "timestamp": timestamp}]}
        ).json()["partitions"][0]["offset"]

    assert by_time(500) == 1  # offset 0 (5000) is below the log start
    assert by_time(4000) == 2  # ... so the first at or after 4000 is offset 2
    assert by_time(7000) == -1


def test_read_committed_stays_exact_at_every_log_start(server, client):
    """Interleaved committed and aborted transactions and plain writes; the log start moved one offset
    at a time across all of them, with a cleaner run after each move: from the log start,
    read_committed returns exactly the committed and plain records, read_uncommitted every record."""
    create(client, "exact")
    producers = [TxnProducer(client, f"exact-{n}") for n in range(2)]
    for producer in producers:
        producer.init()
    visible: dict[int, bool] = {}  # offset -> visible to read_committed; markers are not in it

    def send(producer: TxnProducer, value: str) -> int:
        response = producer.send("exact", 0, value)
        assert response.status_code == 200, response.text
        return response.json()["partitions"][0]["base_offset"]

    pending: dict[int, list[int]] = {0: [], 1: []}
    script = ["t0", "p", "t1", "t0", "c0", "t1", "p", "a1", "t0", "t1", "p", "a0", "c1", "p", "t0", "c0"]
    for step in script:
        if step == "p":
            visible[produce(client, "exact", [{"value": "plain"}])["base_offset"]] = True
        elif step[0] == "t":
            pending[int(step[1])].append(send(producers[int(step[1])], step))
        else:
            number, committed = int(step[1]), step[0] == "c"
            (producers[number].commit if committed else producers[number].abort)()
            visible.update({offset: committed for offset in pending[number]})
            pending[number] = []
    high_watermark = client.get("/v1/topics/exact").json()["partitions"][0]["high_watermark"]
    assert high_watermark == len(visible) + 5  # five markers

    for start in range(high_watermark + 1):
        assert delete_records(client, "exact", {0: start}).json()["partitions"][0]["low_watermark"] == start
        clean(server)
        committed = fetch(client, "exact", start)
        assert committed["error"] is None and committed["log_start_offset"] == start
        assert [r["offset"] for r in committed["records"]] == [o for o in sorted(visible) if o >= start and visible[o]]
        uncommitted = fetch(client, "exact", start, "read_uncommitted")["records"]
        assert [r["offset"] for r in uncommitted] == [o for o in sorted(visible) if o >= start], start
    assert stored_batches(server, "exact") == 0
    assert sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic_id(server, "exact")) == []


def test_two_servers_clean_one_database_at_once_and_keep_the_latest_of_every_key(make_server):
    """Two servers' cleaners (every 20 ms, small chunks) compact one topic while it is written (80 batches)."""
    servers = [make_server(log_cleaner_interval_ms=20, log_cleaner_chunk_batches=3) for _ in range(2)]
    client = servers[0].client
    create(client, "shared-table", cleanup_policy="compact,delete", retention_bytes=10_000_000)
    latest: dict[str, tuple[int, str]] = {}
    for round_number in range(40):
        for writer, server in enumerate(servers):
            records = [
                {"key": f"k{(round_number * 3 + i) % 7}", "value": f"{round_number}-{writer}-{i}"} for i in range(3)
            ]
            entry = produce(server.client, "shared-table", records)
            for i, record in enumerate(records):
                latest[record["key"]] = (entry["base_offset"] + i, record["value"])
    deadline = time.monotonic() + 60
    while True:  # at every moment, whatever the cleaners are doing, the latest value of each key is there
        answer = fetch(client, "shared-table", 0, "read_uncommitted")
        assert answer["error"] is None, answer
        records = answer["records"]
        assert {r["key"]: (r["offset"], r["value"]) for r in records} == latest
        # ... and eventually little else: compaction waits until half the batches are new since its last
        # run, so once the writes stop fewer than twice the live batches (at most one per key) remain.
        if stored_batches(servers[0], "shared-table") < 2 * len(latest):
            break
        assert time.monotonic() < deadline, "the cleaners did not compact the topic"
        time.sleep(0.02)


def test_retention_stops_inside_an_aborted_transaction_and_removes_its_marker_only_past_it(server, client):
    create(client, "sized-txn", retention_bytes=14 + MARKER_BATCH_BYTES)
    aborting = TxnProducer(client, "sized-aborting")
    aborting.init()
    aborting.send("sized-txn", 0, "a" * 1000)  # 0: aborted, large
    produce(client, "sized-txn", [{"value": "p" * 1000}])  # 1: plain, large
    aborting.send("sized-txn", 0, "aborted")  # 2: aborted, 7 bytes
    aborting.abort()  # 3: ABORT marker, its control batch's bytes
    produce(client, "sized-txn", [{"value": "plain-4"}])  # 4: plain, 7 bytes

    clean(server)  # without batch 1, 7 + the marker + 7 bytes (the limit) remain; without 2, less: the
    # log start lands on offset 2, inside the aborted transaction
    assert log_start(client, "sized-txn") == 2
    assert [r["value"] for r in fetch(client, "sized-txn", 2)["records"]] == ["plain-4"]
    assert [r["value"] for r in fetch(client, "sized-txn", 2, "read_uncommitted")["records"]] == ["aborted", "plain-4"]

    half = (14 + MARKER_BATCH_BYTES) // 2
    for digit in ("5", "6"):
        produce(client, "sized-txn", [{"value": digit * half}])
    clean(server)  # now 5 and 6 are the limit: the aborted batch and then its marker go
    assert log_start(client, "sized-txn") == 5
    markers = sql(server.database_url, "SELECT 1 FROM txn_markers WHERE topic_id = $1", topic_id(server, "sized-txn"))
    assert markers == []
    assert [r["value"] for r in fetch(client, "sized-txn", 5)["records"]] == ["5" * half, "6" * half]


def test_retention_by_size_counts_a_marker_as_the_control_batch_it_is(server, client):
    # In Kafka a transaction's marker is a control batch of the log, counted toward retention.bytes
    # like any batch; it counted nothing here (its row stores no records).
    create(client, "sized-markers", retention_bytes=10 + MARKER_BATCH_BYTES)
    writer = TxnProducer(client, "sized-markers-writer")
    writer.init()
    writer.send("sized-markers", 0, "committed!")  # 0: 10 bytes
    writer.commit()  # 1: COMMIT marker
    produce(client, "sized-markers", [{"value": "plain-2..."}])  # 2: 10 bytes
    clean(server)  # without batch 0, the marker and batch 2 remain: the limit
    assert log_start(client, "sized-markers") == 1
    assert [r["value"] for r in fetch(client, "sized-markers", 1)["records"]] == ["plain-2..."]
    clean(server)  # without the marker too, 10 bytes would remain: it stays
    assert log_start(client, "sized-markers") == 1


def test_with_holes_keeps_indexes_and_counts_only_what_stays():
    from app.storage.log import record_codec

    records = [
        record_codec.TextRecord("k", "vv", (), 5),
        record_codec.TextRecord("k", "é", (), 9),
        record_codec.TextRecord(None, None, (), 7),
    ]
    text = record_codec.encode_batch(records, "utf8", 0, "test")
    stored = record_codec.decode_payload(text.payload)
    payload, size, first_ts, max_ts = record_codec.with_holes(stored, [False, True, True])
    assert record_codec.decode_payload(payload) == [None, stored[1], stored[2]]
    assert (size, first_ts, max_ts) == (1 + 2, 9, 9)  # "k" + "é" (2 bytes in UTF-8); the null record has none
    binary = record_codec.encode_batch([record_codec.TextRecord("aw==", "/w==")], "base64", 0, "test")  # k, 0xff
    [binary_record] = record_codec.decode_payload(binary.payload)
    assert binary_record[4] == record_codec.FORM_BASE64
    assert record_codec.key_bytes(binary_record) == record_codec.key_bytes(stored[0]) == b"k"
    assert record_codec.stored_size(binary_record) == 2


def test_compaction_waits_until_half_the_log_is_new(server, client):
    create(client, "ratio", cleanup_policy="compact")
    for key in range(10):
        produce(client, "ratio", [{"key": f"k{key}", "value": "first"}])
    clean(server)  # everything is new: compacted (nothing superseded yet)
    produce(client, "ratio", [{"key": "k0", "value": "second"}])
    produce(client, "ratio", [{"key": "k1", "value": "second"}])
    clean(server)  # 2 new batches of 12: not yet
    assert stored_batches(server, "ratio") == 12
    for key in range(2, 10):
        produce(client, "ratio", [{"key": f"k{key}", "value": "second"}])
    clean(server)  # 10 new of 20: compacted
    assert stored_batches(server, "ratio") == 10
    assert {r["value"] for r in fetch(client, "ratio", 0)["records"]} == {"second"}


def test_compaction_waits_for_the_topics_own_min_cleanable_dirty_ratio(server, client):
    """Kafka's min.cleanable.dirty.ratio, per topic: 0.1 compacts what 0.5 would leave waiting."""
    create(client, "own-ratio", cleanup_policy="compact", min_cleanable_dirty_ratio=0.1)
    for key in range(10):
        produce(client, "own-ratio", [{"key": f"k{key}", "value": "first"}])
    clean(server)
    produce(client, "own-ratio", [{"key": "k0", "value": "second"}])
    produce(client, "own-ratio", [{"key": "k1", "value": "second"}])
    clean(server)  # 2 new batches of 12, above 0.1: compacted (the default, 0.5, would wait)
    assert stored_batches(server, "own-ratio") == 10


def test_a_record_older_than_max_compaction_lag_is_compacted_whatever_the_ratio(server, client):
    """Kafka's max.compaction.lag.ms: records not yet compacted wait for the dirty ratio at most
    that long (by their timestamps), then the partition is compacted anyway."""
    create(client, "max-lag", cleanup_policy="compact", max_compaction_lag_ms=3_600_000)
    for key in range(10):
        produce(client, "max-lag", [{"key": f"k{key}", "value": "first"}])
    clean(server)
    produce(client, "max-lag", [{"key": "k0", "value": "second"}])  # timestamped now: within the lag
    clean(server)  # 1 new batch of 11, below the ratio, none overdue: not yet
    assert stored_batches(server, "max-lag") == 11
    produce(client, "max-lag", [{"key": "k1", "value": "second", "timestamp_ms": 1_000}])  # from 1970: overdue
    clean(server)  # 2 new of 12, below the ratio, but one is older than the lag: compacted
    assert stored_batches(server, "max-lag") == 10


HOUR = 3_600_000


def test_min_compaction_lag_keeps_recent_records_and_everything_after_them(server, client):
    """Kafka's min.compaction.lag.ms: compaction stops at the first batch whose newest record is
    within the lag (by the records' timestamps), and nothing from there on is removed or supersedes
    an earlier record; once the cleaner's clock has passed the lag, the rest is compacted."""
    create(client, "min-lag", cleanup_policy="compact", min_compaction_lag_ms=HOUR)
    now = int(time.time() * 1000)
    two_hours_ago = now - 2 * HOUR
    produce(client, "min-lag", [{"key": "k", "value": "old-1", "timestamp_ms": two_hours_ago}])  # 0
    produce(client, "min-lag", [{"key": "k", "value": "old-2", "timestamp_ms": two_hours_ago}])  # 1
    produce(client, "min-lag", [{"key": "j", "value": "old", "timestamp_ms": two_hours_ago}])  # 2
    produce(client, "min-lag", [{"key": "j", "value": "new"}])  # 3: now, within the lag
    produce(client, "min-lag", [{"key": "k", "value": "new"}])  # 4
    produce(client, "min-lag", [{"key": "r", "value": "recent-1"}])  # 5
    produce(client, "min-lag", [{"key": "r", "value": "recent-2"}])  # 6

    def kept() -> list:
        return [(r["offset"], r["value"]) for r in fetch(client, "min-lag", 0)["records"]]

    clean(server, now_ms=now)
    # Only the old prefix (0..2) is compacted, by itself: k's first value goes (k's second supersedes
    # it there), k's second and j's old one stay though records within the lag supersede them.
    assert kept() == [(1, "old-2"), (2, "old"), (3, "new"), (4, "new"), (5, "recent-1"), (6, "recent-2")]
    clean(server, now_ms=now + HOUR - 1)  # still within the lag: nothing more
    assert stored_batches(server, "min-lag") == 6
    clean(server, now_ms=now + HOUR + 60_000)  # the lag has passed for every record
    assert kept() == [(3, "new"), (4, "new"), (6, "recent-2")]


def test_min_compaction_lag_goes_by_the_append_time_under_log_append_time(server, client):
    """Under LogAppendTime a record's timestamp is the time the server appended it: records sent with
    old timestamps are still within the lag."""
    create(
        client,
        "min-lag-append",
        cleanup_policy="compact",
        min_compaction_lag_ms=HOUR,
        message_timestamp_type="LogAppendTime",
    )
    for value in ("a", "b", "c"):
        produce(client, "min-lag-append", [{"key": "k", "value": value, "timestamp_ms": 1_000}])
    now = int(time.time() * 1000)
    clean(server, now_ms=now)
    assert stored_batches(server, "min-lag-append") == 3
    clean(server, now_ms=now + HOUR + 60_000)
    assert [(r["offset"], r["value"]) for r in fetch(client, "min-lag-append", 0)["records"]] == [(2, "c")]


def test_max_compaction_lag_forces_only_what_min_compaction_lag_allows(server, client):
    """As Kafka's cleaner: a record overdue by max.compaction.lag.ms forces a run whatever the dirty
    ratio, but the run still stops at the first batch within min.compaction.lag.ms; and the ratio
    counts only the batches below that point."""
    create(client, "both-lags", cleanup_policy="compact", min_compaction_lag_ms=HOUR, max_compaction_lag_ms=2 * HOUR)
    now = int(time.time() * 1000)
    for key in range(10):
        produce(client, "both-lags", [{"key": f"k{key}", "value": "first", "timestamp_ms": now - 5 * HOUR}])
    clean(server, now_ms=now)  # 10 new batches of 10, all old enough: compacted (nothing superseded)
    produce(client, "both-lags", [{"key": "k0", "value": "overdue", "timestamp_ms": now - 3 * HOUR}])  # 10
    for key in range(1, 10):  # 11..19: within the minimum lag, superseding k1..k9
        produce(client, "both-lags", [{"key": f"k{key}", "value": "recent"}])
    clean(server, now_ms=now)
    # Below the minimum lag, 1 new batch of 11 (the 9 recent ones count neither way): below the
    # ratio, but overdue. Only k0's first value goes; k1..k9's stay, superseded by recent records.
    values = [(r["offset"], r["value"]) for r in fetch(client, "both-lags", 0)["records"]]
    assert values[:10] == [(offset, "first") for offset in range(1, 10)] + [(10, "overdue")]
    assert stored_batches(server, "both-lags") == 19


def test_the_dirty_ratio_counts_only_what_min_compaction_lag_lets_compaction_take(server, client):
    """Kafka's cleanable ratio leaves out what is within min.compaction.lag.ms: 2 new batches old
    enough, of 12 below the lag, are not enough, however many recent ones follow."""
    create(client, "min-lag-ratio", cleanup_policy="compact", min_compaction_lag_ms=HOUR)
    now = int(time.time() * 1000)
    for key in range(10):
        produce(client, "min-lag-ratio", [{"key": f"k{key}", "value": "first", "timestamp_ms": now - 5 * HOUR}])
    clean(server, now_ms=now)  # everything is new and old enough: compacted (nothing superseded)
    for key in range(2):  # 10, 11
        produce(client, "min-lag-ratio", [{"key": f"k{key}", "value": "second", "timestamp_ms": now - 5 * HOUR}])
    for key in range(10):  # 12..21, within the lag
        produce(client, "min-lag-ratio", [{"key": f"r{key}", "value": "recent"}])
    clean(server, now_ms=now)  # 2 new of 12 below the lag: not yet (12 of 22 would have been enough)
    assert stored_batches(server, "min-lag-ratio") == 22
    clean(server, now_ms=now + HOUR + 60_000)  # now 12 new of 22, all old enough: compacted
    assert stored_batches(server, "min-lag-ratio") == 20
    assert [r["offset"] for r in fetch(client, "min-lag-ratio", 0)["records"]][:2] == [2, 3]
