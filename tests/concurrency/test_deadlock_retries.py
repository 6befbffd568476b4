"""A request that PostgreSQL rolls back to break a deadlock, nothing of it written nor answered, is
run once more: a DeleteTopics, a write batch of one request (a produce). A server on a database of
its own; the test's session closes the lock cycle itself (lock_waits.in_a_deadlock)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.api.test_produce_fetch_api import produce_raw
from tests.api.test_review_fixes import create_topic
from tests.concurrency.lock_waits import in_a_deadlock
from tests.conftest import start_server_on_fresh_database, stop_in_process_server

# A partition's row, by its topic's name and its number.
PARTITION_ROW_SQL = (
    "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = $1 AND p.partition = $2 FOR UPDATE OF p"
)


@pytest.fixture(scope="module")
def server(postgres):
    running = start_server_on_fresh_database(postgres, "deadlock_retries")
    yield running
    stop_in_process_server(running)


def test_a_deletetopics_rolled_back_by_a_deadlock_is_run_once_more(server):
    """Its cascades lock the partitions' rows, and its offsets', in the order of PostgreSQL's plan,
    which appends and a transaction's settling offsets do not follow; rolled back to break a cycle,
    it was answered 500 (its Kafka connection closed). The cycle here: the test holds partition 0's
    row, the deletion (its topic's row locked) waits for it, and the test asks for the topic's row."""
    topic = "deleted-after-a-deadlock"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create_topic(client, topic, partitions=2)

    def deleted() -> int:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            return client.delete(f"/v1/topics/{topic}").status_code

    held = (PARTITION_ROW_SQL, (topic, 0))
    closing = ("SELECT 1 FROM topics WHERE name = $1 FOR KEY SHARE", (topic,))
    assert asyncio.run(in_a_deadlock(server.database_url, held, closing, deleted)) == 204
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get(f"/v1/topics/{topic}").status_code == 404


def test_a_lone_produce_rolled_back_by_a_deadlock_is_written_once_more(server):
    """A write batch of several requests rolled back is written again request by request; one of a
    single request was answered the deadlock (HTTP 500, its Kafka connection closed), though nothing
    of it was written. The cycle here: the test holds partition 1's row, the produce to partitions 0
    and 1 takes partition 0's and waits for it, and the test asks for partition 0's row."""
    topic = "produced-after-a-deadlock"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        create_topic(client, topic, partitions=2)

    def produced() -> tuple[int, list]:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            entries = [{"topic": topic, "partition": p, "records": [{"value": f"to {p}"}]} for p in (0, 1)]
            answer = produce_raw(client, entries)
        if answer.status_code != 200:
            return answer.status_code, []
        return 200, [(entry["base_offset"], entry["error"]) for entry in answer.json()["partitions"]]

    held, closing = (PARTITION_ROW_SQL, (topic, 1)), (PARTITION_ROW_SQL, (topic, 0))
    assert asyncio.run(in_a_deadlock(server.database_url, held, closing, produced)) == (200, [(0, None), (0, None)])
