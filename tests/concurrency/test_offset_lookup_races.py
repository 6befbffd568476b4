"""ListOffsets against the log cleaner: a look-up that reads a partition's batches in more than one
statement finds some gone between them (removed below the log start, or by a topic's deletion) and
answers from those that remain. Real PostgreSQL; the cleaner's removal is made between the look-up's
two statements by the test's own DELETE, on the look-up's connection (autocommit, as the cleaner's
commit would be seen)."""

from __future__ import annotations

import asyncio

from app.storage.database import create_pool
from app.storage.log import partition_log
from app.storage.log.topics import get_topic


class _CleanedBetweenStatements:
    """The look-up's connection, on which the batch of `last_offset` is deleted (as a cleaner run
    would remove it) just before the look-up's first read of a payload."""

    def __init__(self, conn, topic_id: int, last_offset: int) -> None:
        self._conn, self._topic_id, self._last_offset = conn, topic_id, last_offset
        self.removed = False

    async def fetch(self, *args):
        return await self._conn.fetch(*args)

    async def fetchval(self, *args):
        if not self.removed:
            self.removed = True
            await self._conn.execute(
                "DELETE FROM record_batches WHERE topic_id = $1 AND partition = 0 AND last_offset = $2",
                self._topic_id,
                self._last_offset,
            )
        return await self._conn.fetchval(*args)


def test_max_timestamp_answers_from_the_batches_left_when_one_goes_during_the_look_up(server):
    """Regression: ListOffsets' max timestamp (-3, KIP-734) listed the batches, then read each
    payload in a statement of its own; a batch the cleaner removed in between read as no payload,
    and the request failed (UNKNOWN_SERVER_ERROR). It is passed over: the greatest timestamp of what
    is left answers."""
    topic = "max-timestamp-race"
    assert server.client.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    for timestamp in (1_000, 5_000):  # offset 0, then offset 1 with the greatest timestamp
        response = server.client.post(
            f"/v1/topics/{topic}/records",
            json={"partition": 0, "records": [{"value": f"at {timestamp}", "timestamp_ms": timestamp}]},
        )
        assert response.status_code == 200, response.text

    async def look_up():
        pool = await create_pool(server.database_url, 1)
        try:
            async with pool.acquire() as conn:
                info = await get_topic(conn, topic)
                racing = _CleanedBetweenStatements(conn, info.topic_id, 1)
                found = await partition_log._max_timestamp(racing, info, 0, 0, 2)
                return found, racing.removed
        finally:
            await pool.close()

    found, removed = asyncio.run(look_up())
    assert removed
    assert found == (0, 1_000)
