"""A DeleteTopics that PostgreSQL rolls back to break a deadlock is run once more. A server on a
database of its own; the test's session closes the lock cycle itself (lock_waits.py)."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.api.test_review_fixes import create_topic
from tests.concurrency.lock_waits import wait_for_lock_waits
from tests.conftest import start_server_on_fresh_database, stop_in_process_server

TOPIC = "deleted-after-a-deadlock"


@pytest.fixture(scope="module")
def server(postgres):
    running = start_server_on_fresh_database(postgres, "topic_deletion_retry")
    yield running
    stop_in_process_server(running)


def test_a_deletetopics_rolled_back_by_a_deadlock_is_run_once_more(server):
    """Its cascades lock the partitions' rows, and its offsets', in the order of PostgreSQL's plan,
    which appends and a transaction's settling offsets do not follow; rolled back to break a cycle,
    it was answered 500 (its Kafka connection closed). The cycle here: the test holds partition 0's
    row, the deletion (its topic's row locked) waits for it, and the test then asks for the topic's
    row. The test's session never checks for a deadlock, so the deletion is the one rolled back."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create_topic(client, TOPIC, partitions=2)

    def deleted() -> int:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            return client.delete(f"/v1/topics/{TOPIC}").status_code

    async def deleted_after_a_deadlock() -> int:
        observer = await asyncpg.connect(server.database_url)
        holder = await asyncpg.connect(server.database_url)
        try:
            await holder.execute("SET deadlock_timeout = '1h'")
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute(
                "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = $1 AND p.partition = 0 "
                "FOR UPDATE OF p",
                TOPIC,
            )
            deletion = asyncio.create_task(asyncio.to_thread(deleted))
            await wait_for_lock_waits(observer, 1)
            # Granted once PostgreSQL has rolled the deletion back.
            await holder.execute("SELECT 1 FROM topics WHERE name = $1 FOR KEY SHARE", TOPIC)
            await transaction.rollback()
            return await deletion
        finally:
            await holder.close()
            await observer.close()

    assert asyncio.run(deleted_after_a_deadlock()) == 204
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get(f"/v1/topics/{TOPIC}").status_code == 404
