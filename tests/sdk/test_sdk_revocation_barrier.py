"""The SDK consumer under the group's revocation barrier (app/coordinator/http_revocations.py),
against a real server: a partition a rebalance moves from member A to member B reaches B only once
A's on_revoke (and its commit there) has ended, so B starts at what A committed and reads none of
A's records again. Before, B got the partition with the rebalance's generation, while A was still
processing it: B read it from the group's committed offset (here none yet: from the start), and
A's on_revoke commit, accepted in the new generation, could move the offset back behind B's."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx

from tests.sdk.test_sdk_faults import produce_values
from tests.sdk.test_sdk_leaving import next_offsets
from tests.sdk.test_sdk_poll_timeout import MEMBER, both_partitions
from txbroker import Admin, AsyncConsumer, Consumer, TopicPartition

ON_REVOKE_S = 1.0  # what A's on_revoke takes before it commits: B polls all along meanwhile


def six_records_in_two_partitions(server, topic: str) -> None:
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)


def no_record_read_twice(first: list, second: list) -> None:
    read_by_both = {(r.partition, r.offset) for r in first} & {(r.partition, r.offset) for r in second}
    assert not read_by_both, f"records read by both members: {sorted(read_by_both)}"


async def join_while_both_poll(
    a: AsyncConsumer, b: AsyncConsumer, topic: str, a_read: list, b_read: list, until: Callable[[], bool]
) -> None:
    """B subscribes to `topic` (A is its group's member) and polls until `until()`, A polling all
    along, as members do while their group rebalances; what each reads goes to its list."""
    b.subscribe([topic])

    async def b_polls() -> None:
        while not until():
            b_read.extend(await b.poll(timeout_ms=50))

    async with asyncio.timeout(20):
        polling = asyncio.ensure_future(b_polls())
        while not polling.done():
            a_read.extend(await a.poll(timeout_ms=50))
        await polling


async def b_starts_at_a_commit(
    server, topic: str, taken: TopicPartition, b: AsyncConsumer, a_read: list, b_read: list
) -> None:
    """The partition B took from A has A's commit (3, past the three records A read of it), and B
    reads from there: one more record in each partition, and B's first of `taken` is offset 3; no
    record was read by both."""
    assert await b.committed([taken]) == {taken: 3}
    produce_values(server.url, topic, ["r6", "r7"], partitions=2)  # one more record each
    async with asyncio.timeout(20):
        while not any(r.topic_partition == taken for r in b_read):
            b_read += await b.poll(timeout_ms=100)
    assert [r.offset for r in b_read if r.topic_partition == taken] == [3], "B starts at A's commit"
    no_record_read_twice(a_read, b_read)


def test_a_moved_partition_reaches_the_new_member_after_the_async_on_revoke_committed(server):
    topic = "barrier-async"
    six_records_in_two_partitions(server, topic)

    async def scenario() -> None:
        a = AsyncConsumer(server.url, group_id=topic, **MEMBER)
        b = AsyncConsumer(server.url, group_id=topic, **MEMBER)
        a_read: list = []
        b_read: list = []
        revoked: list[set[TopicPartition]] = []
        async with a, b:

            async def on_revoke(partitions: set[TopicPartition]) -> None:
                await asyncio.sleep(ON_REVOKE_S)  # B's poll and heartbeats go on meanwhile
                await a.commit()  # the positions of what A processed, the revoked partition's included
                revoked.append(set(partitions))

            a.subscribe([topic], on_revoke=on_revoke)
            async with asyncio.timeout(20):
                while len(a_read) < 6:
                    a_read += await a.poll(timeout_ms=200)
            await join_while_both_poll(a, b, topic, a_read, b_read, until=lambda: bool(b.assignment() and revoked))
            (taken,) = revoked[0]
            assert b.assignment() == {taken}
            await b_starts_at_a_commit(server, topic, taken, b, a_read, b_read)
            await a.close()

    asyncio.run(scenario())


class SlowCommits(httpx.AsyncHTTPTransport):
    """A transport whose offset commits reach the server ON_REVOKE_S late."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/offsets/commit"):
            await asyncio.sleep(ON_REVOKE_S)
        return await super().handle_async_request(request)


def test_a_moved_partition_reaches_the_new_member_after_the_auto_commit_before_revocation(server):
    """With enable_auto_commit and no on_revoke, the positions of the revoked partition are
    committed before it is revoked (here the commit takes ON_REVOKE_S to arrive): the heartbeats
    acknowledge the generation only after that commit, so B starts at the committed position."""
    topic = "barrier-auto-commit"
    six_records_in_two_partitions(server, topic)

    async def scenario() -> None:
        auto_commit = {**MEMBER, "enable_auto_commit": True, "auto_commit_interval_ms": 600_000}
        a = AsyncConsumer(server.url, group_id=topic, transport=SlowCommits(), **auto_commit)
        b = AsyncConsumer(server.url, group_id=topic, **MEMBER)
        a_read: list = []
        b_read: list = []
        async with a, b:
            a.subscribe([topic])
            async with asyncio.timeout(20):
                while len(a_read) < 6:
                    a_read += await a.poll(timeout_ms=200)
            await join_while_both_poll(
                a, b, topic, a_read, b_read, until=lambda: bool(b.assignment()) and len(a.assignment()) == 1
            )
            (taken,) = b.assignment()
            assert a.assignment() == both_partitions(topic) - {taken}
            await b_starts_at_a_commit(server, topic, taken, b, a_read, b_read)
            await a.close()

    asyncio.run(scenario())


def test_a_moved_partition_reaches_the_new_member_after_the_sync_on_revoke_committed(server):
    """The synchronous Consumer runs on_revoke on its caller's thread while its event loop's thread
    keeps heartbeating: those heartbeats must not acknowledge the generation before the listener
    (and its commit) ended."""
    topic = "barrier-sync"
    six_records_in_two_partitions(server, topic)
    a = Consumer(server.url, group_id=topic, **MEMBER)
    revoked: list = []

    def on_revoke(partitions: set[TopicPartition]) -> None:
        time.sleep(ON_REVOKE_S)
        a.commit()
        revoked.append(set(partitions))

    a.subscribe([topic], on_revoke=on_revoke)
    a_read: list = []
    deadline = time.monotonic() + 20
    while len(a_read) < 6 and time.monotonic() < deadline:
        a_read += a.poll(timeout_ms=200)
    assert next_offsets(a_read) == {tp: 3 for tp in both_partitions(topic)}
    b_read: list = []
    with Consumer(server.url, group_id=topic, **MEMBER) as b:
        b.subscribe([topic])
        stop = threading.Event()

        def a_polls() -> None:
            while not stop.is_set():
                a_read.extend(a.poll(timeout_ms=50))

        polling = threading.Thread(target=a_polls)
        polling.start()
        try:
            while not (b.assignment() and revoked) and time.monotonic() < deadline + 20:
                b_read += b.poll(timeout_ms=50)
        finally:
            stop.set()
            polling.join(timeout=30)
        (taken,) = revoked[0]
        assert b.assignment() == {taken}
        produce_values(server.url, topic, ["r6", "r7"], partitions=2)
        end = time.monotonic() + 20
        while not any(r.topic_partition == taken for r in b_read) and time.monotonic() < end:
            b_read += b.poll(timeout_ms=100)
        assert [r.offset for r in b_read if r.topic_partition == taken] == [3], "B starts at A's commit"
        no_record_read_twice(a_read, b_read)
        a.close()
