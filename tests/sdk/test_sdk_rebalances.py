"""The SDK consumer across rebalances it did not see one by one: a partition that another member
owned meanwhile, however briefly, or whose topic was deleted and re-created, is taken up again from
the group's committed offset, never from the position (or the buffered records) this consumer had
before; and a subscribed topic deleted under it is no error of poll()."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import httpx
import pytest

from txbroker import AsyncAdmin, AsyncConsumer, AsyncProducer, TopicPartition
from txbroker.errors import IllegalStateError, UnknownMemberIdError

FAST = {"retry_backoff_ms": 10, "retry_backoff_max_ms": 100}


async def until(condition, what: str, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


class HeldHeartbeats(httpx.AsyncHTTPTransport):
    """A transport whose group heartbeats wait while `held` (the member's next one then reaches the
    server only after what the test did meanwhile, as if it came late)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.released.set()
        self.answered = 0  # heartbeats answered

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/heartbeat"):
            return await super().handle_async_request(request)
        await self.released.wait()
        response = await super().handle_async_request(request)
        self.answered += 1
        return response


def held_consumer(server, heartbeats: HeldHeartbeats, **options) -> AsyncConsumer:
    """A member of group "g" whose heartbeats the test holds, prefetching nothing (a prefetch
    answered between a topic's deletion and the writes to the new one: out of range, a reset)."""
    return AsyncConsumer(
        server.url,
        group_id="g",
        transport=heartbeats,
        enable_auto_commit=False,
        prefetch=False,
        heartbeat_interval_ms=50,
        **options,
        **FAST,
    )


async def send_values(producer: AsyncProducer, topic: str, values: list[str]) -> None:
    for value in values:
        await producer.send(topic, value=value)
    await producer.flush()


async def re_create_unseen(
    admin: AsyncAdmin, producer: AsyncProducer, heartbeats: HeldHeartbeats, topic: str, values: list[str]
) -> None:
    """Deletes the topic, creates it again and writes `values` to it, no heartbeat of the member
    answered meanwhile; returns once one after it was handled."""
    heartbeats.released.clear()
    await admin.delete_topic(topic)
    await admin.create_topic(topic)
    await send_values(producer, topic, values)
    answered = heartbeats.answered
    heartbeats.released.set()
    # Two: the one after the re-creation was handled before the next one was sent.
    await until(lambda: heartbeats.answered >= answered + 2, "a heartbeat after the re-creation")


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
            # A does not poll, so it does not revoke: the partition reaches B only once A's
            # revocation deadline passes (the group's revocation barrier), here at once: a heartbeat
            # as A with a rebalance timeout of 0, as if A's had run out.
            released = await client.post(
                "/v1/groups/g/heartbeat",
                json={
                    "member_id": consumer._coordinator.member_id,
                    "topics": ["in"],
                    "session_timeout_ms": 30000,
                    "rebalance_timeout_ms": 0,
                },
            )
            released.raise_for_status()
            joined = await client.post(
                "/v1/groups/g/heartbeat",
                json={"member_id": joined.json()["member_id"], "topics": ["in"], "session_timeout_ms": 30000},
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


def test_a_topic_re_created_between_two_heartbeats_is_read_from_its_start(server):
    """The subscribed topic is deleted and created again (as many partitions) with no heartbeat of
    the member in between, then written: the member must read the new topic from its committed
    offset (none: the deletion removed them; so auto_offset_reset), not go on at its position in
    the deleted topic, which skipped the new topic's first records."""

    async def scenario() -> list[bytes]:
        heartbeats = HeldHeartbeats()
        async with AsyncAdmin(server.url) as admin, AsyncProducer(server.url, **FAST) as producer:
            await admin.create_topic("in")
            await send_values(producer, "in", [f"old{i}" for i in range(10)])
            async with held_consumer(server, heartbeats, auto_offset_reset="earliest") as consumer:
                consumer.subscribe(["in"])
                old: list = []
                while len(old) < 10:
                    old += await consumer.poll(timeout_ms=500)
                await consumer.commit()
                await re_create_unseen(admin, producer, heartbeats, "in", [f"new{i}" for i in range(15)])
                new: list = []
                while not new or new[-1].value != b"new14":
                    new += await consumer.poll(timeout_ms=500)
                return [r.value for r in new]

    assert asyncio.run(scenario()) == [f"new{i}".encode() for i in range(15)]


def test_a_subscribed_topic_deleted_under_the_group_is_no_error_of_poll(server, caplog):
    """Until the member's next heartbeat brings the assignment without it, its partitions are
    skipped (the fetch answers UNKNOWN_TOPIC_OR_PARTITION for them); the other topics' records
    keep coming. Kafka's consumer does not raise either."""

    async def scenario() -> None:
        heartbeats = HeldHeartbeats()
        async with AsyncAdmin(server.url) as admin:
            await admin.create_topic("keep")
            await admin.create_topic("gone")
            consumer = AsyncConsumer(
                server.url, group_id="g", transport=heartbeats, auto_offset_reset="earliest", **FAST
            )
            async with consumer, AsyncProducer(server.url, **FAST) as producer:
                consumer.subscribe(["keep", "gone"])
                while len(consumer.assignment()) < 2:
                    await consumer.poll(timeout_ms=100)
                await consumer.poll(timeout_ms=100)  # the positions of both
                heartbeats.released.clear()
                await admin.delete_topic("gone")
                await producer.send_and_wait("keep", value="after")
                with caplog.at_level(logging.WARNING, logger="txbroker.consumer"):
                    records: list = []
                    while not records:
                        records = await consumer.poll(timeout_ms=200)
                    assert [r.value for r in records] == [b"after"]
                    while "skipped until the group's next assignment" not in caplog.text:
                        await consumer.poll(timeout_ms=100)
                assert "UNKNOWN_TOPIC_OR_PARTITION" in caplog.text and "'gone'" in caplog.text
                heartbeats.released.set()
                while consumer.assignment() != {TopicPartition("keep", 0)}:
                    await consumer.poll(timeout_ms=100)

    asyncio.run(scenario())


def test_records_buffered_from_a_deleted_topic_are_not_handed_out_as_the_re_created_ones(server):
    """The member had records of the topic fetched and not yet returned (max_poll_records) when the
    topic was deleted and created again; its new position (auto_offset_reset "latest") happens to
    be the one those records start at. They are the deleted topic's: poll() must not return them."""

    async def scenario() -> list[bytes]:
        heartbeats = HeldHeartbeats()
        async with AsyncAdmin(server.url) as admin, AsyncProducer(server.url, **FAST) as producer:
            await admin.create_topic("in")
            await send_values(producer, "in", [f"old{i}" for i in range(20)])
            async with held_consumer(server, heartbeats, auto_offset_reset="latest", max_poll_records=5) as consumer:
                consumer.subscribe(["in"])
                while not consumer.assignment():
                    await consumer.poll(timeout_ms=100)
                consumer.seek(TopicPartition("in", 0), 0)
                old: list = []
                while not old:
                    old = await consumer.poll(timeout_ms=500)
                assert [r.value for r in old] == [f"old{i}".encode() for i in range(5)], "15 more buffered"
                await re_create_unseen(admin, producer, heartbeats, "in", [f"new{i}" for i in range(5)])
                # This poll adopts the new generation: the position is the new topic's end (5).
                new = await consumer.poll(timeout_ms=200)
                if not new:
                    await producer.send_and_wait("in", value="new5")
                while not new:
                    new = await consumer.poll(timeout_ms=500)
                return [r.value for r in new]

    assert asyncio.run(scenario()) == [b"new5"]


@pytest.mark.parametrize("commit_call", ["commit", "commit_async"])
def test_an_evicted_member_revokes_its_partitions_as_lost_and_cannot_commit_them(server, commit_call):
    """Member A's heartbeats are held past its session timeout: the server evicts it, and B takes
    both partitions, reads on and commits. When A's heartbeats resume they rejoin as a new member;
    A's next poll() first revokes its partitions as lost, and a commit in on_revoke (the usual
    place for one) fails, unsent (UnknownMemberIdError: Kafka's CommitFailedException after
    onPartitionsLost). Before, on_revoke ran with the new membership already adopted, and its
    commit, which the server accepted, took the group's offsets back behind B's: B's records were
    read again. So with commit_async(), which returns at once: poll() adopts the new membership
    before the commit's task first runs, and that task took the membership of then (the new one),
    not the one of the call, as Kafka's commitAsync, which checks the generation in the call.
    Until that poll(), group_metadata() names the evicted member, whose records poll() returned
    (before, the new member id the heartbeats brought, with the old generation)."""
    both = {TopicPartition("in", 0), TopicPartition("in", 1)}

    async def scenario() -> None:
        heartbeats = HeldHeartbeats()
        async with AsyncAdmin(server.url) as admin, AsyncProducer(server.url, **FAST) as producer:
            await admin.create_topic("in", partitions=2)
            for partition in (0, 1):
                for i in range(3):
                    await producer.send("in", value=f"v{i}", partition=partition)
            await producer.flush()
            outcomes: list[asyncio.Future] = []  # the outcome of the first revocation's commit
            processed = {tp: 3 for tp in both}
            a = held_consumer(server, heartbeats, auto_offset_reset="earliest", session_timeout_ms=1000)
            b = AsyncConsumer(
                server.url,
                group_id="g",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                heartbeat_interval_ms=50,
                **FAST,
            )
            async with a, b:

                async def outcome_of(commit: Awaitable[None]) -> Exception | None:
                    try:
                        await commit
                    except UnknownMemberIdError as error:
                        return error
                    return None

                def commit_on_revoke(parts: set[TopicPartition]) -> Awaitable[None] | None:
                    if outcomes:  # the first revocation's commit is the one under test
                        return None
                    if commit_call == "commit_async":  # returns at once: poll() goes on
                        outcomes.append(asyncio.ensure_future(outcome_of(a.commit_async(processed))))
                        return None
                    outcome = asyncio.ensure_future(outcome_of(a.commit(processed)))
                    outcomes.append(outcome)
                    return outcome  # awaited by poll(), as an async listener

                a.subscribe(["in"], on_revoke=commit_on_revoke)
                read: list = []
                async with asyncio.timeout(20):
                    while len(read) < 6:
                        read += await a.poll(timeout_ms=200)
                lost_metadata = a.group_metadata()
                evicted_member = lost_metadata.member_id
                heartbeats.released.clear()  # A's session (1 s) times out
                for partition in (0, 1):
                    for i in range(3, 5):
                        await producer.send("in", value=f"v{i}", partition=partition)
                await producer.flush()
                b.subscribe(["in"])
                b_read: list = []
                async with asyncio.timeout(20):
                    while b.assignment() != both or len(b_read) < 10:
                        b_read += await b.poll(timeout_ms=200)
                await b.commit()
                heartbeats.released.set()
                await until(lambda: a._coordinator.member_id != evicted_member, "A's rejoin as another member")
                # Recorded by the heartbeats, not adopted by poll(): the records poll() returned,
                # and so group_metadata() and the commits, are still the evicted membership's.
                assert a.group_metadata() == lost_metadata
                async with asyncio.timeout(20):
                    while not (outcomes and outcomes[0].done()):
                        await a.poll(timeout_ms=100)
                outcome = outcomes[0].result()
                assert isinstance(outcome, UnknownMemberIdError), "the lost membership's commit was accepted"
                assert "evicted" in str(outcome)
                assert await b.committed(both) == {tp: 5 for tp in both}, "B's progress was taken back"
                async with asyncio.timeout(20):
                    while not a.assignment():
                        await a.poll(timeout_ms=100)
                        # A's partition is B's until B's poll() revokes it (the revocation barrier)
                        assert await b.poll(timeout_ms=50) == []
                await a.commit({tp: 5 for tp in a.assignment()})  # a member again: its commits count

    asyncio.run(scenario())


def test_a_subscribed_consumer_cannot_commit_before_it_joined_its_group(server):
    """A consumer subscribed but not joined yet (no poll() since subscribe()) has no member id or
    generation: its commit(offsets), and commit_async(offsets), fail unsent with IllegalStateError
    (call poll() first), as Kafka's consumer fails a commit without a stable generation locally.
    Before, it was sent as a simple commit (generation -1), which the server applies whatever the
    group: it took the offset of the member that owns the partition back."""
    tp = TopicPartition("in", 0)

    async def scenario() -> None:
        async with AsyncAdmin(server.url) as admin:
            await admin.create_topic("in")
        options = {"group_id": "g", "enable_auto_commit": False, "heartbeat_interval_ms": 50, **FAST}
        async with AsyncConsumer(server.url, **options) as member, AsyncConsumer(server.url, **options) as newcomer:
            member.subscribe(["in"])
            async with asyncio.timeout(20):
                while not member.assignment():
                    await member.poll(timeout_ms=100)
            await member.commit({tp: 5})
            newcomer.subscribe(["in"])
            with pytest.raises(IllegalStateError, match="Call poll\\(\\) first"):
                await newcomer.commit({tp: 0})
            with pytest.raises(IllegalStateError, match="before this consumer joined"):
                await newcomer.commit_async({tp: 0})
            assert await member.committed([tp]) == {tp: 5}, "the member's offset was taken back"

    asyncio.run(scenario())
