"""poll() keeps its timeout while the server is slow to answer a group's requests, against a real
server (real HTTP, real PostgreSQL; the slowness is a transport holding a request on its way): as
Kafka's poll(Duration), a poll whose timeout ends during a join, or during the auto-commit before a
revocation, returns no record, and that work goes on to the next polls. Bounds are generous (the
machine is small and shared), but below the held time, which the old code waited for."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.sdk.test_sdk_faults import FirstRequestsHeld, produce_values
from tests.sdk.test_sdk_leaving import poll_async_until, poll_until
from tests.sdk.test_sdk_poll_timeout import MEMBER, both_partitions
from tests.sdk.test_sdk_revoking import six_records_in_two_partitions
from txbroker import Admin, AsyncConsumer, Consumer, TopicPartition

HELD_S = 4  # how long the server "takes" to answer the held request
QUICK_S = 2  # a poll(timeout_ms=100) took less (it waited for the held request before)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_poll_whose_timeout_ends_during_the_join_returns_and_the_join_goes_on(server, flavour):
    """Regression: the server holds the join (the first heartbeat) for HELD_S; poll(timeout_ms=100)
    on a fresh consumer returns [] within its timeout, and poll(0) too, instead of waiting for the
    whole join (up to default_api_timeout_ms). The join goes on meanwhile: a later poll adopts its
    assignment, and the group has that one member (the polls did not join twice)."""
    topic = f"poll-bounds-join-{flavour}"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    heartbeat = f"/v1/groups/{topic}/heartbeat"
    options = {**MEMBER, "transport": FirstRequestsHeld(HELD_S, heartbeat), "request_timeout_ms": 10_000}

    def check(poll, assignment, member_id) -> None:
        for timeout_ms in (100, 0):
            started = time.monotonic()
            assert poll(timeout_ms) == []
            took = time.monotonic() - started
            assert took < QUICK_S, f"poll(timeout_ms={timeout_ms}) took {took:.1f} s: it waited for the join"
        assert assignment() == set()
        deadline = time.monotonic() + 20
        while not assignment() and time.monotonic() < deadline:
            poll(100)
        assert assignment() == {TopicPartition(topic, 0)}
        with Admin(server.url) as admin:
            assert [m["member_id"] for m in admin.describe_group(topic)["members"]] == [member_id()]

    if flavour == "sync":
        with Consumer(server.url, group_id=topic, **options) as consumer:
            consumer.subscribe([topic])
            check(
                lambda timeout_ms: consumer.poll(timeout_ms=timeout_ms),
                consumer.assignment,
                lambda: consumer.group_metadata().member_id,
            )
        return

    async def scenario() -> None:
        async with AsyncConsumer(server.url, group_id=topic, **options) as consumer:
            consumer.subscribe([topic])
            for timeout_ms in (100, 0):
                started = time.monotonic()
                assert await consumer.poll(timeout_ms=timeout_ms) == []
                took = time.monotonic() - started
                assert took < QUICK_S, f"poll(timeout_ms={timeout_ms}) took {took:.1f} s: it waited for the join"
            deadline = time.monotonic() + 20
            while not consumer.assignment() and time.monotonic() < deadline:
                await consumer.poll(timeout_ms=100)
            assert consumer.assignment() == {TopicPartition(topic, 0)}
            with Admin(server.url) as admin:
                members = admin.describe_group(topic)["members"]
            assert [m["member_id"] for m in members] == [consumer.group_metadata().member_id]

    asyncio.run(scenario())


# Auto-commit only before a revocation (and at close): the interval is never reached in a test.
AUTO_COMMITTING = {
    **MEMBER,
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 60_000,
    "request_timeout_ms": 10_000,
}


class CommitHeld(FirstRequestsHeld):
    """Holds the group's first offset commit for HELD_S, and tells when it was sent."""

    def __init__(self, group_id: str) -> None:
        super().__init__(HELD_S, f"/v1/groups/{group_id}/offsets/commit")
        self.commit_sent = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/offsets/commit"):
            self.commit_sent.set()
        return await super().handle_async_request(request)


def test_a_poll_whose_timeout_ends_during_the_auto_commit_before_a_revocation_returns(server):
    """Regression: with auto-commit, a rebalance commits the revoked partition's position before
    on_revoke; the server holds that commit for HELD_S. Each poll(timeout_ms=0) of the member
    returns within its timeout while the commit is in flight (before, the one that adopted the
    rebalance waited for it, up to default_api_timeout_ms), and a later poll revokes the partition
    once the commit ended, as Kafka's onJoinPrepare: so the commit lands before the next owner
    reads (the revocation barrier), which reads nothing again."""
    topic = "poll-bounds-revocation-commit"
    six_records_in_two_partitions(server, topic)
    config = AUTO_COMMITTING
    revoked: list = []
    first = Consumer(server.url, group_id=topic, transport=CommitHeld(topic), **config)
    first.subscribe([topic], on_revoke=lambda partitions: revoked.append(set(partitions)))
    try:
        poll_until(first, 6)
        with Consumer(server.url, group_id=topic, **config) as second:
            second.subscribe([topic])
            slowest = 0.0
            deadline = time.monotonic() + 30
            while not (len(first.assignment()) == 1 and second.assignment()) and time.monotonic() < deadline:
                started = time.monotonic()
                assert first.poll(timeout_ms=0) == []
                slowest = max(slowest, time.monotonic() - started)
                second.poll(timeout_ms=100)
            assert slowest < QUICK_S, f"poll(timeout_ms=0) took {slowest:.1f} s: it waited for the held commit"
            (taken,) = second.assignment()
            assert revoked == [{taken}]
            assert first.committed([taken]) == {taken: 3}, "revoked before its position was committed"
            assert second.poll(timeout_ms=300) == [], "the new owner read again what the first had read"
    finally:
        first.close()


@contextlib.contextmanager
def a_revocation_commit_held(server, topic: str) -> Iterator[tuple[Consumer, Consumer, list]]:
    """Two auto-committing members of `topic`'s group (six records in two partitions): the first
    read all six, then the second's join made a rebalance revoke a partition of the first, whose
    auto-commit before on_revoke the server holds for HELD_S (CommitHeld). Yields the first, the
    second, and the list of what the first's on_revoke got (nothing yet), once that commit was
    sent; the first is closed after."""
    six_records_in_two_partitions(server, topic)
    revoked: list = []
    transport = CommitHeld(topic)
    first = Consumer(server.url, group_id=topic, transport=transport, **AUTO_COMMITTING)
    first.subscribe([topic], on_revoke=lambda partitions: revoked.append(set(partitions)))
    try:
        poll_until(first, 6)
        with Consumer(server.url, group_id=topic, **AUTO_COMMITTING) as second:
            second.subscribe([topic])
            deadline = time.monotonic() + 30
            while not transport.commit_sent.is_set() and time.monotonic() < deadline:
                assert first.poll(timeout_ms=0) == []
                second.poll(timeout_ms=100)
            assert transport.commit_sent.is_set(), "no rebalance revoked a partition of the first member"
            yield first, second, revoked
    finally:
        first.close()


def test_poll_while_the_auto_commit_before_a_revocation_is_in_flight_returns_the_kept_partitions_records(server):
    """Regression: while a rebalance's auto-commit of the revoked partition is held (its on_revoke
    not run yet), poll() returns the records of the partition the member keeps, as Kafka's consumer
    goes on fetching its owned partitions during a cooperative rebalance, and never a record of
    the revoked one; once the commit ended, on_revoke runs, and the new owner starts at the
    committed offset. Before, a poll waited for the commit (up to its timeout) before it fetched:
    one whose timeout outlasted the commit returned the kept partition's records only after the
    commit and on_revoke, however long the commit took."""
    topic = "poll-bounds-kept-during-revocation-commit"
    with a_revocation_commit_held(server, topic) as (first, second, revoked):
        produce_values(server.url, topic, [f"n{i}" for i in range(4)], partitions=2)  # 2 more each
        deadline = time.monotonic() + 30
        during_the_commit: list = []
        while not revoked and len(during_the_commit) < 2 and time.monotonic() < deadline:
            records = first.poll(timeout_ms=HELD_S * 2000)  # outlasts the held commit
            if not revoked:
                during_the_commit += records
        assert len(during_the_commit) == 2, (
            f"poll() returned {during_the_commit} while the commit before the revocation was in flight: "
            f"expected the two new records of the partition it keeps"
        )
        (kept,) = {r.topic_partition for r in during_the_commit}
        assert [r.offset for r in during_the_commit] == [3, 4]
        second_read: list = []
        while not (revoked and second.assignment()) and time.monotonic() < deadline:
            assert first.poll(timeout_ms=100) == []
            second_read += second.poll(timeout_ms=100)
        assert revoked == [both_partitions(topic) - {kept}]
        (moved,) = revoked[0]
        while len(second_read) < 2 and time.monotonic() < deadline:
            second_read += second.poll(timeout_ms=100)
        assert [(r.topic_partition, r.offset) for r in second_read] == [(moved, 3), (moved, 4)], (
            "the new owner starts at the committed offset"
        )


def test_close_while_the_auto_commit_before_a_revocation_is_in_flight_revokes_its_partitions_too(server):
    """close() while a rebalance's auto-commit is in flight (its polls returned before it ended,
    so its on_revoke has not run) runs on_revoke once, for every assigned partition: the
    rebalance's revoked one too, whose on_revoke would otherwise never run; the final commit comes
    after the held one, and the group's offsets are past what poll() returned."""
    topic = "poll-bounds-close-in-revocation-commit"
    with a_revocation_commit_held(server, topic) as (first, _, revoked):
        assert revoked == [], "on_revoke ran before the auto-commit ended"
        first.close()
        assert revoked == [both_partitions(topic)]
    with Admin(server.url) as admin:
        group = admin.describe_group(topic)
    assert {(o["partition"], o["offset"]) for o in group["offsets"]} == {(0, 3), (1, 3)}


@pytest.mark.parametrize("lookup", ["offsets/fetch", "offsets/list"])
def test_a_poll_whose_timeout_ends_during_the_positions_lookup_returns_and_the_lookup_goes_on(server, lookup):
    """Regression: the server holds the lookup of a newly assigned partition's position (its
    committed offset, OffsetFetch; or, with none committed, auto_offset_reset's ListOffsets) for
    HELD_S. Each poll(timeout_ms=100) returns within its timeout meanwhile (before, the poll waited
    for the lookup's one attempt, up to request_timeout_ms), and a later poll takes the lookup's
    answer and reads from there: the committed offset, or the beginning."""
    topic = f"poll-bounds-position-{lookup.replace('/', '-')}"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    produce_values(server.url, topic, [f"r{i}" for i in range(4)])
    tp = TopicPartition(topic, 0)
    committed = 2 if lookup == "offsets/fetch" else None
    if committed is not None:
        with Consumer(server.url, group_id=topic, **MEMBER) as committer:
            committer.assign([tp])
            committer.commit({tp: committed})
    path = f"/v1/groups/{topic}/{lookup}" if lookup == "offsets/fetch" else f"/v1/{lookup}"
    options = {**MEMBER, "transport": FirstRequestsHeld(HELD_S, path), "request_timeout_ms": 10_000}
    with Consumer(server.url, group_id=topic, **options) as consumer:
        consumer.subscribe([topic])
        received: list = []
        slowest = 0.0
        deadline = time.monotonic() + 30
        while len(received) < 4 - (committed or 0) and time.monotonic() < deadline:
            started = time.monotonic()
            received += consumer.poll(timeout_ms=100)
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < QUICK_S, f"poll(timeout_ms=100) took {slowest:.1f} s: it waited for the held {lookup}"
        assert [r.offset for r in received] == list(range(committed or 0, 4))


class CommitHeldAndRecorded(CommitHeld):
    """CommitHeld, recording when each request went on to the server (after its hold)."""

    def __init__(self, group_id: str) -> None:
        super().__init__(group_id)
        self.forwarded: list[tuple[str, float]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in self.to_hold:
            self.commit_sent.set()
            self.to_hold.discard(request.url.path)
            await asyncio.sleep(self.seconds)
        self.forwarded.append((request.url.path, time.monotonic()))
        return await httpx.AsyncHTTPTransport.handle_async_request(self, request)


def test_close_gives_up_the_auto_commit_before_a_revocation_that_outlasts_its_timeout(server):
    """Regression: close(timeout) while a rebalance's auto-commit is held past the timeout gives that
    commit up as it gives up its own final commit: nothing of the consumer goes on after close()
    returned. Before, the commit's task outlived close() and sent its OffsetCommit afterwards (with
    the membership it had left)."""
    topic = "poll-bounds-close-gives-up-revocation-commit"
    six_records_in_two_partitions(server, topic)

    async def scenario() -> None:
        transport = CommitHeldAndRecorded(topic)
        first = AsyncConsumer(server.url, group_id=topic, transport=transport, **AUTO_COMMITTING)
        first.subscribe([topic])
        await poll_async_until(first, 6)
        async with AsyncConsumer(server.url, group_id=topic, **AUTO_COMMITTING) as second:
            second.subscribe([topic])
            deadline = time.monotonic() + 30
            while not transport.commit_sent.is_set() and time.monotonic() < deadline:
                assert await first.poll(timeout_ms=0) == []
                await second.poll(timeout_ms=100)
            assert transport.commit_sent.is_set(), "no rebalance revoked a partition of the first member"
            await first.close(timeout=0.5)
            closed = time.monotonic()
            await asyncio.sleep(HELD_S + 1)
        late = [path for path, at in transport.forwarded if at > closed]
        assert late == [], f"requests sent after close() returned: {late}"

    asyncio.run(scenario())


class FirstAnswerHeld(httpx.AsyncHTTPTransport):
    """Holds the answer to the first request to `path` for HELD_S on its way back: the server has
    done the request (a join made the member) but the client does not know it yet."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path: str | None = path

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = await super().handle_async_request(request)
        if request.url.path == self.path:
            self.path = None
            await answer.aread()
            await asyncio.sleep(HELD_S)
        return answer


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_close_during_a_join_that_reached_the_server_leaves_the_membership_it_made(server, flavour):
    """Regression: poll(timeout_ms=100) returns while the join's answer is on its way (the join goes
    on), then close(): the membership the server made for that join is left (LeaveGroup), so the
    group does not keep it, with its partitions, until its session times out. Before, close()
    cancelled the join and never learned its member id: the group had a member nobody was."""
    topic = f"poll-bounds-close-in-join-{flavour}"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    options = {
        **MEMBER,
        "transport": FirstAnswerHeld(f"/v1/groups/{topic}/heartbeat"),
        "request_timeout_ms": 10_000,
        "session_timeout_ms": 60_000,
    }

    def members() -> list:
        with Admin(server.url) as admin:
            return admin.describe_group(topic)["members"]

    def joined_on_the_server() -> bool:
        deadline = time.monotonic() + HELD_S / 2  # the answer is still held then
        while not members() and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(members()) == 1

    if flavour == "sync":
        consumer = Consumer(server.url, group_id=topic, **options)
        consumer.subscribe([topic])
        assert consumer.poll(timeout_ms=100) == []
        assert joined_on_the_server()
        consumer.close()
    else:

        async def scenario() -> None:
            consumer = AsyncConsumer(server.url, group_id=topic, **options)
            consumer.subscribe([topic])
            assert await consumer.poll(timeout_ms=100) == []
            assert await asyncio.to_thread(joined_on_the_server)
            await consumer.close()

        asyncio.run(scenario())
    assert members() == [], "close() left behind the membership its join made"
