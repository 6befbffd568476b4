"""The SDK consumer across rebalances it did not see one by one: a partition that another member
owned meanwhile, however briefly, is taken up again from the group's committed offset, never from
the position (or the buffered records) this consumer had before."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from txbroker import AsyncAdmin, AsyncConsumer, AsyncProducer, TopicPartition

FAST = {"retry_backoff_ms": 10, "retry_backoff_max_ms": 100}


async def until(condition, what: str, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


async def group_generation(client: httpx.AsyncClient, group_id: str) -> int:
    answer = await client.get(f"/v1/groups/{group_id}")
    answer.raise_for_status()
    return answer.json()["generation_id"]


@pytest.mark.parametrize("heartbeat_sees_the_generation_between", [True, False])
def test_a_partition_another_member_owned_between_two_polls_restarts_from_its_committed_offset(
    server, heartbeat_sees_the_generation_between
):
    """Member A polls, then B joins (taking one of A's partitions), commits past A's position and
    leaves, all before A's next poll: A's heartbeats bring the latest generation, in which A owns
    both partitions again. A must not go on from its own position of the partition B owned (nor
    hand out what it had buffered of it): B processed and committed those records. Whether or not
    A's heartbeats answered the generation in between: when one did, the partition A kept
    throughout goes on from A's position; when none did, A cannot know who owned what meanwhile."""

    async def scenario() -> None:
        async with AsyncAdmin(server.url) as admin:
            await admin.create_topic("in", partitions=2)
        async with AsyncProducer(server.url, **FAST) as producer:
            for i in range(20):
                for partition in (0, 1):
                    await producer.send("in", value=f"v{i}", partition=partition)
            await producer.flush()
        events: list[tuple[str, set]] = []
        consumer = AsyncConsumer(
            server.url,
            group_id="g",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=3,
            heartbeat_interval_ms=20,
            **FAST,
        )
        async with consumer, httpx.AsyncClient(base_url=server.url) as client:
            consumer.subscribe(
                ["in"],
                on_assign=lambda parts: events.append(("assign", parts)),
                on_revoke=lambda parts: events.append(("revoke", parts)),
            )
            # A handles a few records of each partition (commits nothing: a partition it goes on
            # with must not restart from the group's committed offset, here none, so the earliest).
            first: list = []
            for _ in range(2):
                batch: list = []
                while not batch:
                    batch = await consumer.poll(timeout_ms=500)
                first += batch
                consumer.pause(*{r.topic_partition for r in batch})
            consumer.resume(*consumer.paused())
            both = {TopicPartition("in", 0), TopicPartition("in", 1)}
            assert consumer.assignment() == both and {r.topic_partition for r in first} == both
            events.clear()

            # B joins: the range assignment gives it one of the partitions; it processes that
            # partition up to offset 15, commits, and leaves.
            joined = await client.post(
                "/v1/groups/g/heartbeat", json={"member_id": "", "topics": ["in"], "session_timeout_ms": 30000}
            )
            joined.raise_for_status()
            b = joined.json()
            [taken] = [TopicPartition(a["topic"], p) for a in b["assignment"] for p in a["partitions"]]
            committed = await client.post(
                "/v1/groups/g/offsets/commit",
                json={
                    "member_id": b["member_id"],
                    "generation_id": b["generation_id"],
                    "offsets": [{"topic": taken.topic, "partition": taken.partition, "offset": 15}],
                },
            )
            assert committed.json()["offsets"][0]["error"] is None
            if heartbeat_sees_the_generation_between:
                await until(
                    lambda: consumer._coordinator._latest[0] == b["generation_id"],
                    "A's heartbeat of the generation B joined",
                )
            (await client.post("/v1/groups/g/leave", json={"member_id": b["member_id"]})).raise_for_status()
            latest = await group_generation(client, "g")
            assert latest == b["generation_id"] + 1
            # A's heartbeats learn the latest generation (in which it owns both partitions again)
            # before its next poll: it never adopted the one in between.
            await until(lambda: consumer._coordinator._latest[0] == latest, "A's heartbeat of the latest generation")

            returned: list = []
            while not any(r.topic_partition == taken for r in returned):
                returned += await consumer.poll(timeout_ms=500)
            assert consumer.assignment() == both
            offsets_of_taken = [r.offset for r in returned if r.topic_partition == taken]
            assert offsets_of_taken[0] == 15, (
                f"A handed out {taken}'s records from offset {offsets_of_taken[0]}: B had processed and committed "
                f"them up to 15 while it owned the partition"
            )
            [(revoke, revoked), (assign, assigned)] = events
            assert (revoke, assign) == ("revoke", "assign") and taken in revoked and taken in assigned
            if heartbeat_sees_the_generation_between:
                assert revoked == assigned == {taken}, "the partition A owned throughout is not revoked"
                [kept] = both - {taken}
                kept_offsets = [r.offset for r in first + returned if r.topic_partition == kept]
                assert kept_offsets == list(range(len(kept_offsets))), "A goes on with it from its own position"

    asyncio.run(scenario())
