"""max_poll_interval_ms (Kafka's max.poll.interval.ms, KIP-62) against a real server (real HTTP, real
PostgreSQL): a member whose application stops calling poll() (a stuck call, a deadlock) leaves its
group, so that another member takes its partitions over; its commits of the lost membership fail,
and its next poll() calls on_revoke and rejoins. A poll that waits for records, or returns none,
is polling: it keeps the membership however long it waits."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import httpx
import pytest

from tests.sdk.test_sdk_faults import produce_values
from tests.sdk.test_sdk_integration import FAST
from tests.sdk.test_sdk_leaving import next_offsets, poll_until
from txbroker import Admin, AsyncConsumer, Consumer, Producer, TopicPartition
from txbroker.errors import UnknownMemberIdError

MAX_POLL_INTERVAL_MS = 1500
# Short heartbeats: the other member learns of the departure, and takes the partitions, at once.
MEMBER = {"auto_offset_reset": "earliest", "enable_auto_commit": False, "heartbeat_interval_ms": 100, **FAST}


def both_partitions(topic: str) -> set[TopicPartition]:
    return {TopicPartition(topic, 0), TopicPartition(topic, 1)}


def records_of(records: list) -> set[tuple[int, int]]:
    return {(r.partition, r.offset) for r in records}


def test_a_consumer_that_stops_polling_leaves_its_partitions_to_another_member(server, caplog):
    """A member reads both partitions, then stops polling (its application is stuck): after
    max_poll_interval_ms its heartbeat task leaves the group, and the other member gets both
    partitions and reads them. Its commit afterwards fails, unsent (UnknownMemberIdError, Kafka's
    CommitFailedException), and so does a transactional offset commit with its group_metadata(),
    which the server refuses; its next poll() calls on_revoke for both (there is no on_lost),
    on the caller's thread, then rejoins as a new member and reads again what it never committed.
    Before, its heartbeats kept it in the group for good: the other member never got its
    partitions."""
    topic = "poll-timeout"
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)
    events: list = []
    stuck = Consumer(server.url, group_id=topic, max_poll_interval_ms=MAX_POLL_INTERVAL_MS, **MEMBER)
    stuck.subscribe(
        [topic],
        on_assign=lambda parts: events.append(("assign", set(parts))),
        on_revoke=lambda parts: events.append(("revoke", set(parts), threading.current_thread())),
    )
    processed = next_offsets(poll_until(stuck, 6))
    lost_membership = stuck.group_metadata()
    with (
        caplog.at_level(logging.WARNING, logger="txbroker.consumer"),
        Consumer(server.url, group_id=topic, **MEMBER) as other,
    ):
        other.subscribe([topic])
        received: list = []
        deadline = time.monotonic() + 20  # the stuck member's session (30 s) does not time out meanwhile
        while (other.assignment() != both_partitions(topic) or len(received) < 6) and time.monotonic() < deadline:
            received += other.poll(timeout_ms=200)
        assert other.assignment() == both_partitions(topic)
        assert records_of(received) == {(p, o) for p in (0, 1) for o in range(3)}
        assert any("max_poll_interval_ms" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

        with pytest.raises(UnknownMemberIdError, match="poll\\(\\) was not called for max_poll_interval_ms"):
            stuck.commit(processed)
        with pytest.raises(UnknownMemberIdError, match="max_poll_interval_ms"):
            stuck.commit_async(processed).result(10)
        with Producer(server.url, transactional_id=f"{topic}-tx", **FAST) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            with pytest.raises(UnknownMemberIdError, match="is not in group"):  # the server's answer
                producer.send_offsets_to_transaction(processed, lost_membership)
            producer.abort_transaction()

        assert events == [("assign", both_partitions(topic))]
        again = stuck.poll(timeout_ms=0)
        # Its partition is the other member's until the other's poll() revokes it (the group's
        # revocation barrier): both poll, as their applications would.
        deadline = time.monotonic() + 20
        while not stuck.assignment() and time.monotonic() < deadline:
            assert other.poll(timeout_ms=50) == []
            again += stuck.poll(timeout_ms=50)
        (kept,) = stuck.assignment()  # one of the two: the range assignor's, of two members
        assert events[1:] == [("revoke", both_partitions(topic), threading.current_thread()), ("assign", {kept})]
        assert stuck.group_metadata().member_id not in ("", lost_membership.member_id)
        deadline = time.monotonic() + 20
        while len(again) < 3 and time.monotonic() < deadline:
            again += stuck.poll(timeout_ms=200)
        assert records_of(again) == {(kept.partition, o) for o in range(3)}, "nothing was committed: read again"
        stuck.commit()  # a member again
    stuck.close()


class RecordedRequests(httpx.AsyncHTTPTransport):
    """A transport that records the path of every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


def test_an_async_consumer_that_stops_polling_leaves_once_and_stops_heartbeating(server):
    """The same with an AsyncConsumer, whose poll() runs the listeners on the event loop: the
    stuck member sends one LeaveGroup and no heartbeat after it until its next poll(), which awaits
    its (async) on_revoke and rejoins; commit_async() in between fails, unsent."""
    topic = "poll-timeout-async"
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)
    events: list = []

    async def on_revoke(parts: set[TopicPartition]) -> None:
        events.append(("revoke", set(parts)))

    async def scenario() -> None:
        requests = RecordedRequests()
        stuck = AsyncConsumer(
            server.url, group_id=topic, max_poll_interval_ms=MAX_POLL_INTERVAL_MS, transport=requests, **MEMBER
        )
        async with stuck, AsyncConsumer(server.url, group_id=topic, **MEMBER) as other:
            stuck.subscribe([topic], on_assign=lambda parts: events.append(("assign", set(parts))), on_revoke=on_revoke)
            read: list = []
            async with asyncio.timeout(20):
                while len(read) < 6:
                    read += await stuck.poll(timeout_ms=200)
            processed = next_offsets(read)
            other.subscribe([topic])
            received: list = []
            async with asyncio.timeout(20):
                while other.assignment() != both_partitions(topic) or len(received) < 6:
                    received += await other.poll(timeout_ms=200)
            assert records_of(received) == {(p, o) for p in (0, 1) for o in range(3)}

            with pytest.raises(UnknownMemberIdError, match="max_poll_interval_ms"):
                await stuck.commit_async(processed)
            leave_path = f"/v1/groups/{topic}/leave"
            assert requests.paths.count(leave_path) == 1
            after_leave = requests.paths[requests.paths.index(leave_path) + 1 :]
            assert not [path for path in after_leave if path.endswith("/heartbeat")], after_leave
            assert not [path for path in after_leave if path.endswith("/offsets/commit")], "sent"

            await stuck.poll(timeout_ms=0)
            async with asyncio.timeout(20):  # its partition is the other's until the other revokes it
                while not stuck.assignment():
                    assert await other.poll(timeout_ms=50) == []
                    await stuck.poll(timeout_ms=50)
            assert events == [
                ("assign", both_partitions(topic)),
                ("revoke", both_partitions(topic)),
                ("assign", stuck.assignment()),
            ]
            assert len(stuck.assignment()) == 1
            assert requests.paths.count(leave_path) == 1

    asyncio.run(scenario())


def test_a_poll_that_waits_longer_than_max_poll_interval_ms_or_returns_nothing_keeps_the_membership(server):
    """As Kafka's: every poll() call restarts the poll timer, whether or not records come back, and
    a poll waiting for records (here one fetch long-polling 2.5 times max_poll_interval_ms) is
    polling: the member keeps its partitions, its membership and its commits."""
    topic = "poll-timeout-kept"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    revoked: list = []
    with Consumer(server.url, group_id=topic, max_poll_interval_ms=500, **MEMBER) as consumer:
        consumer.subscribe([topic], on_revoke=revoked.append)
        deadline = time.monotonic() + 20
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        member_id = consumer.group_metadata().member_id
        assert consumer.poll(timeout_ms=1250) == []
        for _ in range(10):  # empty polls, 100 ms apart: 1 s without records
            assert consumer.poll(timeout_ms=0) == []
            time.sleep(0.1)
        consumer.commit({TopicPartition(topic, 0): 0})
        assert revoked == []
        assert consumer.group_metadata().member_id == member_id
        assert consumer.assignment() == {TopicPartition(topic, 0)}
        with Admin(server.url) as admin:
            assert [m["member_id"] for m in admin.describe_group(topic)["members"]] == [member_id]


def test_a_poll_whose_on_assign_outlasts_max_poll_interval_ms_hands_out_no_record_of_the_lost_membership(server):
    """The poll timer runs while poll() runs the rebalance listeners (their time is the
    application's, as in Kafka). Here on_assign takes longer than max_poll_interval_ms: meanwhile
    the heartbeat task leaves the group, and the other member gets both partitions and reads them.
    The same poll() then revokes them as lost, rejoins and returns only records of its new
    membership, which it can commit: as Kafka's joinGroupIfNeeded, which loops again when the
    heartbeat thread reset the generation during onPartitionsAssigned, before any fetch. Before,
    poll() went on to fetch for the lost membership: it handed out the records the other member had
    read already, and their commit failed (UnknownMemberIdError)."""
    topic = "poll-timeout-in-on-assign"
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)
    events: list = []
    other_read: list = []
    with (
        Consumer(server.url, group_id=topic, max_poll_interval_ms=MAX_POLL_INTERVAL_MS, **MEMBER) as slow,
        Consumer(server.url, group_id=topic, **MEMBER) as other,
    ):

        def on_assign(parts: set[TopicPartition]) -> None:
            events.append(("assign", set(parts)))
            if len(events) > 1:
                return
            # The first assignment's listener outlasts the poll timeout; once the slow member left,
            # the other joins, gets both partitions and reads them, meanwhile.
            time.sleep(MAX_POLL_INTERVAL_MS / 1000 + 0.5)
            other.subscribe([topic])
            deadline = time.monotonic() + 20
            while (other.assignment() != both_partitions(topic) or len(other_read) < 6) and time.monotonic() < deadline:
                other_read.extend(other.poll(timeout_ms=200))

        slow.subscribe([topic], on_assign=on_assign, on_revoke=lambda parts: events.append(("revoke", set(parts))))
        records: list = []
        deadline = time.monotonic() + 20
        while not records and time.monotonic() < deadline:
            records = slow.poll(timeout_ms=200)
        assert records_of(other_read) == {(p, o) for p in (0, 1) for o in range(3)}
        assert events[:2] == [("assign", both_partitions(topic)), ("revoke", both_partitions(topic))], events
        kept = slow.assignment()
        assert {r.topic_partition for r in records} <= kept, "records of the lost membership were handed out"
        slow.commit(next_offsets(records))  # the membership's own records: committed


def test_an_async_poll_whose_on_assign_outlasts_max_poll_interval_ms_hands_out_no_record_of_the_lost_membership(
    server,
):
    """The same with an AsyncConsumer, whose poll() awaits a coroutine on_assign on the event loop,
    where the heartbeat task leaves meanwhile."""
    topic = "poll-timeout-in-async-on-assign"
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)
    events: list = []

    async def scenario() -> None:
        slow = AsyncConsumer(server.url, group_id=topic, max_poll_interval_ms=MAX_POLL_INTERVAL_MS, **MEMBER)
        async with slow, AsyncConsumer(server.url, group_id=topic, **MEMBER) as other:
            other_read: list = []

            async def on_assign(parts: set[TopicPartition]) -> None:
                events.append(("assign", set(parts)))
                if len(events) > 1:
                    return
                await asyncio.sleep(MAX_POLL_INTERVAL_MS / 1000 + 0.5)  # the slow member leaves meanwhile
                other.subscribe([topic])
                async with asyncio.timeout(20):
                    while other.assignment() != both_partitions(topic) or len(other_read) < 6:
                        other_read.extend(await other.poll(timeout_ms=200))

            slow.subscribe([topic], on_assign=on_assign, on_revoke=lambda parts: events.append(("revoke", set(parts))))
            records: list = []
            async with asyncio.timeout(20):
                while not records:
                    records = await slow.poll(timeout_ms=200)
                    # The rejoined member's partition is the other's until the other's poll()
                    # revokes it (the group's revocation barrier). The other subscribes in the
                    # slow on_assign: a poll of slow's may return before that, its join not done.
                    if other.subscription():
                        other_read.extend(await other.poll(timeout_ms=50))
            assert records_of(other_read) == {(p, o) for p in (0, 1) for o in range(3)}
            assert events[:2] == [("assign", both_partitions(topic)), ("revoke", both_partitions(topic))], events
            assert {r.topic_partition for r in records} <= slow.assignment(), "records of the lost membership"
            await slow.commit(next_offsets(records))

    asyncio.run(scenario())


class HeldLeaves(httpx.AsyncHTTPTransport):
    """A transport that records every request's path and holds each LeaveGroup until `released`
    (a threading.Event, so that a test's thread releases what the consumer's loop holds), for
    3 s at most."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []
        self.released = threading.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        held_until = time.monotonic() + 3  # answered then at the latest, released or not
        while request.url.path.endswith("/leave") and not self.released.is_set() and time.monotonic() < held_until:
            await asyncio.sleep(0.01)
        return await super().handle_async_request(request)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_poll_after_the_poll_timeout_keeps_its_timeout_while_the_leave_is_unanswered(server, flavour):
    """After max_poll_interval_ms the heartbeat task leaves the group; the server does not answer
    the LeaveGroup yet (held). poll(timeout_ms=0) then revokes the partitions (on_revoke) and
    returns at once, without records, as Kafka's poll never blocks past its timeout for a rejoin;
    the LeaveGroup goes on meanwhile, and once it is answered a later poll() rejoins as a new
    member: the group has that member only (the leave reached the server: the old member did not
    linger until its session timed out), and exactly one LeaveGroup was sent. Before, the poll
    waited for the LeaveGroup's answer (here held 3 s), up to request_timeout_ms."""
    topic = f"poll-timeout-held-leave-{flavour}"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    transport = HeldLeaves()
    revoked: list = []
    options = {"max_poll_interval_ms": 500, "request_timeout_ms": 4000, "transport": transport, **MEMBER}
    leave_path = f"/v1/groups/{topic}/leave"

    def check(poll, assignment, group_metadata) -> None:
        deadline = time.monotonic() + 20
        while not assignment() and time.monotonic() < deadline:
            poll(100)
        lost_member = group_metadata().member_id
        deadline = time.monotonic() + 20
        while leave_path not in transport.paths and time.monotonic() < deadline:
            time.sleep(0.05)  # no poll: the poll timer expires, the heartbeat task leaves (held)
        assert leave_path in transport.paths
        started = time.monotonic()
        assert poll(0) == []
        took = time.monotonic() - started
        assert took < 1, f"poll(timeout_ms=0) took {took:.1f} s, waiting for the LeaveGroup's answer"
        assert revoked == [{TopicPartition(topic, 0)}]
        assert assignment() == set()
        transport.released.set()
        deadline = time.monotonic() + 20
        while not assignment() and time.monotonic() < deadline:
            poll(100)
        assert assignment() == {TopicPartition(topic, 0)}
        new_member = group_metadata().member_id
        assert new_member not in ("", lost_member)
        with Admin(server.url) as admin:
            assert [m["member_id"] for m in admin.describe_group(topic)["members"]] == [new_member]
        assert transport.paths.count(leave_path) == 1

    if flavour == "sync":
        with Consumer(server.url, group_id=topic, **options) as consumer:
            consumer.subscribe([topic], on_revoke=lambda parts: revoked.append(set(parts)))
            check(lambda timeout_ms: consumer.poll(timeout_ms=timeout_ms), consumer.assignment, consumer.group_metadata)
        return

    # An AsyncConsumer on a loop in a thread of its own (as the sync Consumer's), as the checks block.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(call):
        async def run():
            result = call()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    consumer = on_loop(lambda: AsyncConsumer(server.url, group_id=topic, **options))
    on_loop(lambda: consumer.subscribe([topic], on_revoke=lambda parts: revoked.append(set(parts))))
    try:
        check(
            lambda timeout_ms: on_loop(lambda: consumer.poll(timeout_ms=timeout_ms)),
            lambda: on_loop(consumer.assignment),
            lambda: on_loop(consumer.group_metadata),
        )
    finally:
        on_loop(consumer.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
