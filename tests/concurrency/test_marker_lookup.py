"""EndTxn's look-up of the markers its transaction may have left (app/storage/log/locks.py, read by
markers.plan_markers): with transaction version 1 (Kafka's EndTxn below v5, what librdkafka and the
Java client send) the epoch carries over, so every earlier transaction of the producer's epoch left a
marker of that epoch in the partition. The look-up answers one row per marker asked for, however
many there are (answering them all made each EndTxn's work grow with the producer's number of
transactions), and still tells a transaction whose marker is written (a re-run EndTxn writes none)
from one still open (which gets its own marker). Real PostgreSQL, the coordinator in-process as
tests/concurrency/test_transaction_concurrency.py drives it."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx

from app.coordinator.batched_writes import BatchedWrites
from app.coordinator.produce import PartitionRecords, ProduceCommand
from app.coordinator.transaction_coordinator import EndTxnCommand, TransactionCoordinator
from app.coordinator.transaction_metadata import TRANSACTION_VERSION_CLASSIC
from app.settings import Settings
from app.storage.database import create_pool
from app.storage.log import locks, markers, record_codec
from app.storage.log.partition_log import CONTROL_COMMIT
from app.storage.log.topics import get_topic
from tests.many_transactions import marker_rows_read

TRANSACTIONS = 5


def test_a_producer_s_many_markers_of_one_epoch_are_looked_up_as_one(server):
    async def scenario():
        async with _transactional_id(server, "epoch-kept", 2) as (pool, writes, init):
            producer = ("epoch-kept", init.producer_id, init.producer_epoch)

            async def transaction(sequence: int, commit: bool = True) -> None:
                await writes.add_partitions(*producer, [("epoch-kept", 0), ("epoch-kept", 1)])
                command = ProduceCommand(
                    *producer,
                    "utf8",
                    [
                        PartitionRecords("epoch-kept", p, sequence, [record_codec.TextRecord(None, f"v{sequence}")])
                        for p in (0, 1)
                    ],
                )
                [results] = await asyncio.gather(writes.enqueue_produce(command))
                assert all(result.base_offset >= 0 for result in results), results
                if commit:
                    ended = await writes.end_transaction(*producer, True, TRANSACTION_VERSION_CLASSIC)
                    assert (ended.producer_id, ended.producer_epoch) == producer[1:], "version 1 keeps the epoch"

            for sequence in range(TRANSACTIONS):
                await transaction(sequence)
            async with pool.acquire() as conn:
                topic = await get_topic(conn, "epoch-kept")
                key = (topic.topic_id, 0, init.producer_id, init.producer_epoch)
                written = await conn.fetch(
                    "SELECT marker_offset FROM txn_markers WHERE topic_id = $1 AND partition = 0 "
                    "AND producer_id = $2 AND producer_epoch = $3 ORDER BY marker_offset",
                    topic.topic_id,
                    init.producer_id,
                    init.producer_epoch,
                )
                assert len(written) == TRANSACTIONS, "each transaction left its marker, all of one epoch"
                asked = locks.PartitionLocks(
                    frozenset({(topic.topic_id, 0)}),
                    frozenset({(topic.topic_id, 0, init.producer_id)}),
                    frozenset({key}),
                )
                async with conn.transaction():
                    rows = await conn.fetch(locks._LOCK_HEADS_SQL, [topic.topic_id], [0], *_columns(asked))
                    marker_rows = [row for row in rows if row["marker_offset"] is not None]
                    assert len(marker_rows) == 1, f"{len(marker_rows)} marker rows for one marker asked for"
                    locked = await locks.lock_partitions(conn, asked)
                    assert locked.markers == {key: written[-1]["marker_offset"]}, "the latest is the one answered"
                    # The last transaction's EndTxn run again (as recovery may): its marker is written.
                    end = markers.TransactionEnd(
                        [(topic.topic_id, 0)], init.producer_id, init.producer_epoch, CONTROL_COMMIT
                    )
                    assert markers.plan_markers([end], locked, 0) is None

            # One more transaction, left open: same epoch, a marker of it exists, but this one gets its own.
            await transaction(TRANSACTIONS, commit=False)
            async with pool.acquire() as conn, conn.transaction():
                end = markers.TransactionEnd(
                    [(topic.topic_id, 0)], init.producer_id, init.producer_epoch, CONTROL_COMMIT
                )
                locked = await locks.lock_partitions(conn, markers.locks_for_markers([end]))
                assert key in locked.markers, "an earlier transaction's marker of the epoch exists"
                assert markers.plan_markers([end], locked, 0) is not None, "the open transaction gets its marker"
            ended = await writes.end_transaction(*producer, True, TRANSACTION_VERSION_CLASSIC)
            assert ended.producer_epoch == init.producer_epoch
            async with pool.acquire() as conn:
                count = await conn.fetchval(
                    "SELECT count(*) FROM txn_markers WHERE topic_id = $1 AND producer_id = $2 AND control_type = $3",
                    topic.topic_id,
                    init.producer_id,
                    CONTROL_COMMIT,
                )
                assert count == 2 * (TRANSACTIONS + 1), "one COMMIT marker per transaction and partition, no more"

    asyncio.run(scenario())


def test_with_an_epoch_bumped_at_each_end_the_look_up_reads_one_marker_however_many_precede(server):
    """Transaction version 2 (HTTP's EndTxn, Kafka's v5+): every transaction ends with a new epoch,
    so the epoch an EndTxn asks about has no marker yet. The look-up still reads one index entry,
    the producer's latest marker, where it read back through every earlier one (counted by
    PostgreSQL's EXPLAIN ANALYZE: rows, not time)."""

    async def scenario():
        async with _transactional_id(server, "epoch-bumped", 1) as (pool, writes, init):
            producer_id, epoch = init.producer_id, init.producer_epoch
            for sequence in range(TRANSACTIONS):
                await writes.add_partitions("epoch-bumped", producer_id, epoch, [("epoch-bumped", 0)])
                record = record_codec.TextRecord(None, f"v{sequence}")
                command = ProduceCommand(
                    "epoch-bumped", producer_id, epoch, "utf8", [PartitionRecords("epoch-bumped", 0, 0, [record])]
                )
                [results] = await asyncio.gather(writes.enqueue_produce(command))
                assert all(result.base_offset >= 0 for result in results), results
                ended = await writes.end_transaction("epoch-bumped", producer_id, epoch, True)
                assert ended.producer_epoch > epoch, "version 2 bumps the epoch"
                producer_id, epoch = ended.producer_id, ended.producer_epoch
            async with pool.acquire() as conn:
                topic = await get_topic(conn, "epoch-bumped")
                assert (
                    await conn.fetchval(
                        "SELECT count(*) FROM txn_markers WHERE topic_id = $1 AND producer_id = $2",
                        topic.topic_id,
                        producer_id,
                    )
                    == TRANSACTIONS
                )
                key = (topic.topic_id, 0, producer_id, epoch)
                asked = locks.PartitionLocks(
                    frozenset({(topic.topic_id, 0)}), frozenset({(topic.topic_id, 0, producer_id)}), frozenset({key})
                )
                async with conn.transaction():
                    await conn.execute("SET LOCAL enable_seqscan = off")  # the index, as on a large table
                    explained = await conn.fetchval(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + locks._LOCK_HEADS_SQL,
                        [topic.topic_id],
                        [0],
                        *_columns(asked),
                    )
                    [plan] = json.loads(explained)
                    read = marker_rows_read(plan["Plan"])
                    assert read <= 1, f"the look-up read {read} markers of the producer to answer one"
                    locked = await locks.lock_partitions(conn, asked)
                    assert key not in locked.markers, "no marker of the epoch the next transaction ends with"

    asyncio.run(scenario())


def test_a_produce_queued_behind_its_end_txn_of_version_1_is_written_after_the_marker(server):
    """Regression: with version 1 the epoch carries over, so a produce of the transactional id queued
    behind its EndTxn, in the same write batch, is not fenced: it begins the id's next transaction.
    The write batch wrote its record batch before the EndTxn's marker, so the ended transaction's
    COMMIT covered it, and closed the new transaction there: read_committed readers saw its record
    at once, and still after that transaction aborted (its ABORT marker skipped as written). It is
    now written after the marker, as it would be alone."""

    async def scenario():
        async with _transactional_id(server, "queued-behind-end", 1) as (_, writes, init):
            producer = ("queued-behind-end", init.producer_id, init.producer_epoch)

            def produce(sequence: int, value: str) -> ProduceCommand:
                records = [record_codec.TextRecord(None, value)]
                return ProduceCommand(*producer, "utf8", [PartitionRecords("queued-behind-end", 0, sequence, records)])

            [first] = await asyncio.gather(writes.enqueue_produce(produce(0, "ended")))
            # Queued in one turn of the event loop, the EndTxn first, as two connections' requests
            # woken by one poll.
            ended = writes.batcher.enqueue(EndTxnCommand(*producer, True, TRANSACTION_VERSION_CLASSIC))
            late = writes.enqueue_produce(produce(1, "next"))
            assert (await ended).state.value == "CompleteCommit"
            [next_result] = await late
            assert next_result.base_offset == first[0].base_offset + 2, "after the COMMIT marker"
            aborted = await writes.end_transaction(*producer, False, TRANSACTION_VERSION_CLASSIC)
            assert aborted.state.value == "CompleteAbort"

        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            markers_page = await client.get("/v1/topics/queued-behind-end/partitions/0/markers")
            assert [(m["offset"], m["type"]) for m in markers_page.json()["markers"]] == [(1, "COMMIT"), (3, "ABORT")]
            fetched = await client.post(
                "/v1/fetch",
                json={
                    "isolation_level": "read_committed",
                    "partitions": [{"topic": "queued-behind-end", "partition": 0, "offset": 0}],
                },
            )
            assert [r["value"] for r in fetched.json()["partitions"][0]["records"]] == ["ended"]

    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def _transactional_id(server, name: str, partitions: int):
    """A topic `name` and a transactional id `name` initialized on it, with the coordinator's write
    batches in-process: (pool, writes, InitProducerId's answer)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        (await client.post("/v1/topics", json={"name": name, "partitions": partitions})).raise_for_status()
    pool = await create_pool(server.database_url, 2)
    try:
        coordinator = TransactionCoordinator(pool, Settings(database_url=server.database_url))
        writes = BatchedWrites(coordinator, max_records=1000)
        yield pool, writes, await coordinator.init_producer_id(name, 60_000, -1, -1)
    finally:
        await pool.close()


def _columns(asked: locks.PartitionLocks) -> list[list]:
    """The producers' and markers' arguments of the lock statement, as lock_partitions passes them."""
    producers, marker_keys = sorted(asked.producers), sorted(asked.markers)
    return [*(list(column) for column in zip(*producers)), *(list(column) for column in zip(*marker_keys))]
