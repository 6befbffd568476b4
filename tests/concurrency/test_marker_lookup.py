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

import httpx

from app.coordinator.batched_writes import BatchedWrites
from app.coordinator.produce import PartitionRecords, ProduceCommand
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.coordinator.transaction_metadata import TRANSACTION_VERSION_CLASSIC
from app.settings import Settings
from app.storage.database import create_pool
from app.storage.log import locks, markers, record_codec
from app.storage.log.partition_log import CONTROL_COMMIT
from app.storage.log.topics import get_topic

TRANSACTIONS = 5


def test_a_producer_s_many_markers_of_one_epoch_are_looked_up_as_one(server):
    httpx.post(f"{server.url}/v1/topics", json={"name": "epoch-kept", "partitions": 2}, timeout=30).raise_for_status()

    async def scenario():
        pool = await create_pool(server.database_url, 2)
        try:
            coordinator = TransactionCoordinator(pool, Settings(database_url=server.database_url))
            writes = BatchedWrites(coordinator, max_records=1000)
            init = await coordinator.init_producer_id("epoch-kept", 60_000, -1, -1)
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
        finally:
            await pool.close()

    asyncio.run(scenario())


def _columns(asked: locks.PartitionLocks) -> list[list]:
    """The producers' and markers' arguments of the lock statement, as lock_partitions passes them."""
    producers, marker_keys = sorted(asked.producers), sorted(asked.markers)
    return [*(list(column) for column in zip(*producers)), *(list(column) for column in zip(*marker_keys))]
