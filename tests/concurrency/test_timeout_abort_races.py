"""The timeout abort racing its producer's EndTxn(commit), made deterministic (the timing-based
rounds are in test_transaction_concurrency.py): this test's PostgreSQL session holds the row of a
partition of the transaction, where whichever of the two comes first stops once it holds the
transactional id's row (about to write its markers), and the other is sent then. The transaction
also holds a TxnOffsetCommit, and a require_stable OffsetFetch sees it pending in between.

Either outcome is Kafka's, entirely: the commit wins (COMMIT markers, its records and offsets
visible, the timeout abort finds nothing to do) or the abort does (ABORT markers, nothing of it
visible, its offsets discarded, the producer told PRODUCER_FENCED and fenced for good)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
import httpx

from app.clock import now_ms
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.storage.database import connect, create_pool
from tests.api.test_review_fixes import read_values
from tests.api.test_transactions import TxnProducer
from tests.concurrency.lock_waits import wait_for_lock_waits

# The server's own timeout worker stays out of the way: the test runs the abort itself.
NEVER_MS = 3_600_000
TIMEOUT_MS = 1
GROUP = "timeout-race-group"


async def _abort_timed_out(server) -> int:
    """One run of the server's timeout abort (the background worker's code), on a pool of its own."""
    pool = await create_pool(server.database_url, 2)
    try:
        return await TransactionCoordinator(pool, server.settings).abort_timed_out()
    finally:
        await pool.close()


def _open_transaction(server, transactional_id: str) -> TxnProducer:
    client = server.client
    client.post("/v1/topics", json={"name": "timed", "partitions": 1}).raise_for_status()
    producer = TxnProducer(client, transactional_id, timeout_ms=TIMEOUT_MS)
    producer.init()
    assert producer.send("timed", 0, "v1", "v2").json()["partitions"][0]["error"] is None
    committed = client.post(
        "/v1/txn/offset-commit",
        json={**producer.ids(), "group_id": GROUP, "offsets": [{"topic": "timed", "partition": 0, "offset": 7}]},
    )
    assert committed.status_code == 200 and committed.json()["offsets"][0]["error"] is None, committed.text
    pending = _fetch_offset(client, require_stable=True)
    assert pending["error"] is not None and pending["error"]["code"] == "UNSTABLE_OFFSET_COMMIT", pending
    started_ms = client.get(f"/v1/transactions/{transactional_id}").json()["start_time_ms"]
    while now_ms() <= started_ms + TIMEOUT_MS:  # past its timeout: the abort takes it from now on
        time.sleep(0.001)
    return producer


def _committing(server, producer: TxnProducer):
    """The producer's EndTxn(commit), as a coroutine function."""

    async def commit() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await client.post("/v1/txn/end", json={**producer.ids(), "committed": True})

    return commit


def _fetch_offset(client: httpx.Client, require_stable: bool) -> dict:
    response = client.post(
        f"/v1/groups/{GROUP}/offsets/fetch",
        json={"partitions": [{"topic": "timed", "partition": 0}], "require_stable": require_stable},
    )
    assert response.status_code == 200, response.text
    return response.json()["offsets"][0]


@contextlib.asynccontextmanager
async def _holding_the_partition(server) -> AsyncIterator[asyncpg.Connection]:
    """Holds the row of the transaction's data partition (let go at the end); yields a session that
    watches the lock waits."""
    holder, observer = [await connect(server.database_url) for _ in range(2)]
    try:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM partitions p JOIN topics t ON t.topic_id = p.topic_id "
                "WHERE t.name = 'timed' AND p.partition = 0 FOR UPDATE OF p"
            )
            yield observer
    finally:
        for conn in (holder, observer):
            await conn.close()


async def _race(server, first, second) -> tuple:
    """`first` (a coroutine function) runs until it waits at the partition's row, held here; then
    `second` is started and reaches its own wait; then the row is let go. Both results."""
    async with _holding_the_partition(server) as observer:
        first_task = asyncio.create_task(first())
        await wait_for_lock_waits(observer, 1)
        second_task = asyncio.create_task(second())
        await wait_for_lock_waits(observer, 2)
        assert not first_task.done() and not second_task.done()
    return await first_task, await second_task


async def _commit_parked_while_the_timeout_runs(server, commit) -> tuple:
    """The commit holds the id's row and waits at the partition's row; the timeout abort runs
    meanwhile, to its end (it skips the id's row, SKIP LOCKED, without waiting); then the
    partition's row is let go. Both results."""
    async with _holding_the_partition(server) as observer:
        commit_task = asyncio.create_task(commit())
        await wait_for_lock_waits(observer, 1)
        aborted = await _abort_timed_out(server)
        assert not commit_task.done()
    return await commit_task, aborted


def _check_aborted(server, producer: TxnProducer) -> None:
    client = server.client
    assert read_values(client, "timed") == []
    assert read_values(client, "timed", isolation="read_uncommitted") == ["v1", "v2"]
    offset = _fetch_offset(client, require_stable=True)
    assert offset["error"] is None and offset["offset"] == -1, offset
    described = client.get(f"/v1/transactions/{producer.transactional_id}").json()
    assert described["state"] == "CompleteAbort"
    assert described["producer_epoch"] > producer.producer_epoch
    late = producer.send("timed", 0, "zombie")
    assert late.status_code == 409 and late.json()["error"]["code"] == "PRODUCER_FENCED", late.text
    partition = client.get("/v1/topics/timed").json()["partitions"][0]
    assert partition["last_stable_offset"] == partition["high_watermark"], partition


def test_the_timeout_abort_that_locks_first_wins_and_the_commit_is_refused(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=NEVER_MS)
    producer = _open_transaction(server, "timeout-first")
    commit = _committing(server, producer)

    aborted, commit_answer = asyncio.run(_race(server, lambda: _abort_timed_out(server), commit))
    assert aborted == 1
    assert commit_answer.status_code == 409, commit_answer.text
    assert commit_answer.json()["error"]["code"] == "PRODUCER_FENCED", commit_answer.text
    _check_aborted(server, producer)


def test_the_commit_that_locks_first_wins_and_the_timeout_abort_finds_nothing(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=NEVER_MS)
    producer = _open_transaction(server, "commit-first")
    commit = _committing(server, producer)

    commit_answer, aborted = asyncio.run(_commit_parked_while_the_timeout_runs(server, commit))
    assert aborted == 0
    assert commit_answer.status_code == 200, commit_answer.text
    assert commit_answer.json()["state"] == "CompleteCommit"
    assert asyncio.run(_abort_timed_out(server)) == 0  # committed: nothing left to time out
    client = server.client
    assert read_values(client, "timed") == ["v1", "v2"]
    offset = _fetch_offset(client, require_stable=True)
    assert offset["error"] is None and offset["offset"] == 7, offset
