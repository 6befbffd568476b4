"""DeleteGroups and DeleteTopics both delete the offsets of a group for a topic, parked at a row lock
the test holds (lock_waits.py). A server on a database of its own: the test fills its offsets table
so that PostgreSQL plans each deletion as it does on a large table (see the test)."""

from __future__ import annotations

import asyncio

import asyncpg
import httpx
import pytest

from tests.api.test_deleted_topic_offsets import all_offsets, commit_offsets
from tests.api.test_review_fixes import create_topic
from tests.concurrency.lock_waits import parked_in_turn
from tests.conftest import start_server_on_fresh_database, stop_in_process_server

TOPIC, GROUP = "offsets-lock-order", "offsets-lock-order-group"
# Enough rows of other groups that the planner reads one group's offsets by the primary key's index
# (in key order) and one topic's by scanning the table (in the rows' order in it).
OTHER_OFFSETS = 20_000


@pytest.fixture(scope="module")
def server(postgres):
    running = start_server_on_fresh_database(postgres, "group_offsets_lock_order")
    yield running
    stop_in_process_server(running)


async def filled_and_analyzed(database_url: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, commit_timestamp_ms, "
            "record_offset) SELECT 'other-' || n, 'other-topic', 0, 0, 0, 0 FROM generate_series(1, $1) AS n",
            OTHER_OFFSETS,
        )
        await connection.execute("ANALYZE group_offsets")
    finally:
        await connection.close()


def test_deletegroups_and_deletetopics_of_the_same_offsets_both_succeed(server):
    """DeleteGroups holds the topics of the offsets it deletes (FOR KEY SHARE, as commits hold
    them) before it deletes them, so a DeleteTopics of one of them (which locks its topic's row
    first) comes before or after it: the two deleted the group's offsets of the topic in two orders
    (the group's by the index, in partition order; the topic's by a scan of the table, where
    partition 1's row, committed first, lies before partition 0's) and deadlocked, PostgreSQL
    aborting one (answered 500). The interleaving that deadlocked: DeleteTopics waits for partition
    1's row, held by the test; DeleteGroups takes partition 0's, then waits behind DeleteTopics for
    partition 1's; let go, DeleteTopics takes partition 1's and waits for partition 0's."""
    asyncio.run(filled_and_analyzed(server.database_url))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create_topic(client, TOPIC, partitions=2)
        assert commit_offsets(client, GROUP, [(TOPIC, 1, 5)]) == [None]
        assert commit_offsets(client, GROUP, [(TOPIC, 0, 7)]) == [None]

    def deleted(path: str) -> int:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            return client.delete(path).status_code

    topic_deleted, group_deleted = asyncio.run(
        parked_in_turn(
            server.database_url,
            "SELECT 1 FROM group_offsets WHERE group_id = $1 AND topic = $2 AND partition = 1 FOR UPDATE",
            (GROUP, TOPIC),
            lambda: deleted(f"/v1/topics/{TOPIC}"),
            lambda: deleted(f"/v1/groups/{GROUP}"),
        )
    )
    assert (topic_deleted, group_deleted) == (204, 204)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert all_offsets(client, GROUP) == {}
