"""Producer-state expiry racing the first write of a transaction (issue 22, review finding 1).

Each test interleaves real PostgreSQL sessions with real HTTP requests, deterministically: a third
session holds a KEY SHARE lock on the producer's state row, which stops the expiry's DELETE on that
row (a DELETE needs the row exclusively) but not the append's update of it (an update that leaves
the key alone is compatible with KEY SHARE). So the expiry takes its snapshot while the row says
"idle", the request commits its update (a transaction opened there), and only then does the
expiry get to the row. The expiry must see that the row it is about to delete changed and keep it:
the open transaction's state pins the partition's last stable offset, so read_committed readers
never see its records before its marker, and its next batch continues its sequence.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from app.clock import now_ms
from app.storage.database import connect
from tests.api.test_review_fixes import _offsets_partition_of, read_values, run_producer_expiry
from tests.api.test_transactions import TxnProducer
from tests.conftest import RunningServer

LOCK_WAIT_TIMEOUT_S = 30
EXPIRATION_MS = 1


async def _state_row(conn: asyncpg.Connection, topic: str, partition: int, producer_id: int) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT s.last_append_ms, s.current_txn_first_offset FROM producer_states s "
        "JOIN topics t ON t.topic_id = s.topic_id WHERE t.name = $1 AND s.partition = $2 AND s.producer_id = $3",
        topic,
        partition,
        producer_id,
    )


async def _wait_until_a_session_waits_for_a_lock(observer: asyncpg.Connection) -> None:
    deadline = time.monotonic() + LOCK_WAIT_TIMEOUT_S
    while not await observer.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ):
        assert time.monotonic() < deadline, "the expiry never reached the locked state row"
        await asyncio.sleep(0.005)


async def _expire_while_the_row_changes(running, topic: str, partition: int, producer_id: int, change_the_row) -> None:
    """Runs the expiry with a cutoff past the row's last append, so that the row is idle in the
    expiry's snapshot; `change_the_row` (a blocking HTTP call) runs while the expiry waits for the
    row, and commits before the expiry may touch it."""
    settings = running.settings.model_copy(update={"producer_id_expiration_ms": EXPIRATION_MS})
    with_tiny_expiration = RunningServer(running.url, running.database_url, running.client, settings)
    locker, observer = [await connect(running.database_url) for _ in range(2)]
    try:
        before = await _state_row(observer, topic, partition, producer_id)
        assert before is not None and before["current_txn_first_offset"] is None
        while now_ms() <= before["last_append_ms"] + EXPIRATION_MS:  # the row is idle past the expiration
            await asyncio.sleep(0.001)
        async with locker.transaction():
            await locker.execute(
                "SELECT 1 FROM producer_states s JOIN topics t ON t.topic_id = s.topic_id "
                "WHERE t.name = $1 AND s.partition = $2 AND s.producer_id = $3 FOR KEY SHARE OF s",
                topic,
                partition,
                producer_id,
            )
            expiry = asyncio.create_task(asyncio.to_thread(run_producer_expiry, with_tiny_expiration))
            await _wait_until_a_session_waits_for_a_lock(observer)
            # Stamped after the expiry's cutoff (now - EXPIRATION_MS): not idle by the server's clock.
            await asyncio.to_thread(change_the_row)
            assert not expiry.done()
        await expiry
    finally:
        for conn in (locker, observer):
            await conn.close()


def test_expiry_keeps_the_state_of_a_transaction_that_opens_on_the_partition_meanwhile(server):
    client = server.client
    client.post("/v1/topics", json={"name": "expiring", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "expiry-race")
    producer.init()
    assert producer.send("expiring", 0, "committed").json()["partitions"][0]["error"] is None
    producer.commit()  # the state row stays, idle: no transaction open, no append since

    def first_batch_of_the_next_transaction():
        response = producer.send("expiring", 0, "open-1")
        assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text

    asyncio.run(
        _expire_while_the_row_changes(server, "expiring", 0, producer.producer_id, first_batch_of_the_next_transaction)
    )

    async def state():
        conn = await connect(server.database_url)
        try:
            return await _state_row(conn, "expiring", 0, producer.producer_id)
        finally:
            await conn.close()

    row = asyncio.run(state())
    assert row is not None and row["current_txn_first_offset"] is not None, "the open transaction's state went"
    assert read_values(client, "expiring", 0, "read_committed") == ["committed"]  # the LSO stays pinned
    second = producer.send("expiring", 0, "open-2")  # sequence 1 continues the transaction's batches
    assert second.status_code == 200 and second.json()["partitions"][0]["error"] is None, second.text
    producer.abort()
    assert read_values(client, "expiring", 0, "read_committed") == ["committed"]
    assert read_values(client, "expiring", 0, "read_uncommitted") == ["committed", "open-1", "open-2"]


def test_expiry_keeps_the_state_of_a_transactional_offset_commit_made_meanwhile(server):
    client = server.client
    client.post("/v1/topics", json={"name": "consumed", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, "offsets-race")
    producer.init()

    def txn_offset_commit(offset: int) -> None:
        response = client.post(
            "/v1/txn/offset-commit",
            json={
                **producer.ids(),
                "group_id": "race-group",
                "offsets": [{"topic": "consumed", "partition": 0, "offset": offset}],
            },
        )
        assert response.status_code == 200 and response.json()["offsets"][0]["error"] is None, response.text

    txn_offset_commit(1)
    offsets_partition = _offsets_partition_of(client, "offsets-race")
    producer.commit()
    committed = read_values(client, "__consumer_offsets", offsets_partition, "read_committed")
    assert len(committed) == 1

    asyncio.run(
        _expire_while_the_row_changes(
            server, "__consumer_offsets", offsets_partition, producer.producer_id, lambda: txn_offset_commit(2)
        )
    )

    # The open commit's record stays hidden from read_committed readers of __consumer_offsets...
    assert read_values(client, "__consumer_offsets", offsets_partition, "read_committed") == committed
    assert len(read_values(client, "__consumer_offsets", offsets_partition, "read_uncommitted")) == 2
    producer.abort()
    # ...and, aborted, is never shown to them.
    assert read_values(client, "__consumer_offsets", offsets_partition, "read_committed") == committed
    response = client.post(
        "/v1/groups/race-group/offsets/fetch", json={"partitions": [{"topic": "consumed", "partition": 0}]}
    )
    assert response.json()["offsets"][0]["offset"] == 1


def test_a_transactional_producer_state_expires_per_partition_and_its_transaction_goes_on(server):
    """Not a race: the rule the fix chose for transactional producers. Their state goes row by row,
    as in Kafka (an open transaction's row stays); the transaction's first batch on a partition
    whose row went starts at sequence 0 anyway, every transaction having an epoch of its own."""
    client = server.client
    client.post("/v1/topics", json={"name": "per-partition", "partitions": 2}).raise_for_status()
    producer = TxnProducer(client, "per-partition-app")
    producer.init()
    for partition in (0, 1):
        assert producer.send("per-partition", partition, f"old-{partition}").json()["partitions"][0]["error"] is None
    producer.commit()
    assert producer.send("per-partition", 0, "new-0").json()["partitions"][0]["error"] is None

    async def rows() -> dict:
        conn = await connect(server.database_url)
        try:
            return {p: await _state_row(conn, "per-partition", p, producer.producer_id) for p in (0, 1)}
        finally:
            await conn.close()

    last_append_ms = asyncio.run(rows())[0]["last_append_ms"]
    while now_ms() <= last_append_ms + EXPIRATION_MS:  # every row is idle past the 1 ms expiration
        time.sleep(0.001)
    settings = server.settings.model_copy(update={"producer_id_expiration_ms": EXPIRATION_MS})
    run_producer_expiry(RunningServer(server.url, server.database_url, server.client, settings))
    states = asyncio.run(rows())
    assert states[0] is not None and states[0]["current_txn_first_offset"] is not None
    assert states[1] is None
    response = producer.send("per-partition", 1, "new-1")
    assert response.status_code == 200 and response.json()["partitions"][0]["error"] is None, response.text
    producer.commit()
    assert [read_values(client, "per-partition", p) for p in (0, 1)] == [["old-0", "new-0"], ["old-1", "new-1"]]
