"""on_revoke (Kafka's onPartitionsRevoked) against a real server (real HTTP, real PostgreSQL): while
it runs, the revoked partitions are still assigned to the consumer, as in Kafka's consumer, so the
listener commits their positions with commit() (no offsets), reads position() and may seek(); they
leave the assignment when it returns. The same in close()'s on_revoke."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.sdk.test_sdk_faults import produce_values
from tests.sdk.test_sdk_leaving import next_offsets, poll_async_until, poll_until
from tests.sdk.test_sdk_poll_timeout import MEMBER, both_partitions
from txbroker import Admin, AsyncConsumer, Consumer, TopicPartition


def six_records_in_two_partitions(server, topic: str) -> None:
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)


def listener_that_commits(consumer, seen: list):
    """An on_revoke that records the assignment and each revoked partition's position, seeks each
    to its position (a seek of a revoked partition must work) and commits with commit(), which
    commits the positions of the assigned partitions: the revoked ones' too."""

    def on_revoke(partitions: set[TopicPartition]) -> None:
        positions = {tp: consumer.position(tp) for tp in partitions}
        for tp, position in positions.items():
            consumer.seek(tp, position)
        seen.append((set(partitions), consumer.assignment(), positions))
        consumer.commit()

    return on_revoke


def test_on_revoke_commits_the_positions_of_the_partitions_it_revokes(server):
    """A member reads both partitions (3 records each), then another member joins and takes one:
    the first member's on_revoke sees the revoked partition still assigned, its position 3,
    seeks it, and its commit() commits 3 for it (and for the partition it keeps). The new owner
    then starts at 3, reading nothing again. Before, the partition had already left the
    assignment: position() and seek() raised IllegalStateError, and commit() committed nothing for
    it, so its records were read again by the new owner."""
    topic = "revoking-sync"
    six_records_in_two_partitions(server, topic)
    seen: list = []
    first = Consumer(server.url, group_id=topic, **MEMBER)
    first.subscribe([topic], on_revoke=listener_that_commits(first, seen))
    assert next_offsets(poll_until(first, 6)) == {tp: 3 for tp in both_partitions(topic)}
    with Consumer(server.url, group_id=topic, **MEMBER) as second:
        second.subscribe([topic])
        deadline = time.monotonic() + 20
        while not (seen and second.assignment()) and time.monotonic() < deadline:
            first.poll(timeout_ms=100)
            second.poll(timeout_ms=100)
        assert seen, "no partition was revoked"
        (revoked, assignment_in_listener, positions) = seen[0]
        (taken,) = revoked
        assert assignment_in_listener == both_partitions(topic), "revoked before the listener ran"
        assert positions == {taken: 3}
        assert first.assignment() == both_partitions(topic) - {taken}, "still assigned after the listener"
        assert first.committed([taken]) == {taken: 3}, "on_revoke's commit() left the revoked partition out"
        assert second.assignment() == {taken}
        assert second.position(taken) == 3
        assert second.poll(timeout_ms=300) == [], "the new owner read again what was committed"
        first.close()  # before the second member leaves: its on_revoke commits in the current generation


def test_an_async_on_revoke_commits_the_positions_of_the_partitions_it_revokes(server):
    """The same with AsyncConsumers, whose poll() awaits an async on_revoke on the event loop."""
    topic = "revoking-async"
    six_records_in_two_partitions(server, topic)
    seen: list = []

    async def scenario() -> None:
        first = AsyncConsumer(server.url, group_id=topic, **MEMBER)
        second = AsyncConsumer(server.url, group_id=topic, **MEMBER)
        async with first, second:

            async def on_revoke(partitions: set[TopicPartition]) -> None:
                positions = {tp: await first.position(tp) for tp in partitions}
                for tp, position in positions.items():
                    first.seek(tp, position)
                seen.append((set(partitions), first.assignment(), positions))
                await first.commit()

            first.subscribe([topic], on_revoke=on_revoke)
            read: list = []
            async with asyncio.timeout(20):
                while len(read) < 6:
                    read += await first.poll(timeout_ms=200)
            second.subscribe([topic])
            async with asyncio.timeout(20):
                while not (seen and second.assignment()):
                    await first.poll(timeout_ms=100)
                    await second.poll(timeout_ms=100)
            (revoked, assignment_in_listener, positions) = seen[0]
            (taken,) = revoked
            assert assignment_in_listener == both_partitions(topic), "revoked before the listener ran"
            assert positions == {taken: 3}
            assert first.assignment() == both_partitions(topic) - {taken}
            assert await first.committed([taken]) == {taken: 3}, "on_revoke's commit() left it out"
            assert await second.poll(timeout_ms=300) == [], "the new owner read again what was committed"
            await first.close()  # before the second member leaves (as above)

    asyncio.run(scenario())


def test_close_runs_an_on_revoke_whose_commit_commits_the_positions(server):
    """close()'s on_revoke sees every partition assigned, with its position, and its commit()
    (no offsets) commits the positions: the group's offsets are past what poll() returned."""
    topic = "revoking-close"
    six_records_in_two_partitions(server, topic)
    seen: list = []
    consumer = Consumer(server.url, group_id=topic, **MEMBER)
    consumer.subscribe([topic], on_revoke=listener_that_commits(consumer, seen))
    poll_until(consumer, 6)
    consumer.close()
    assert seen == [(both_partitions(topic), both_partitions(topic), {tp: 3 for tp in both_partitions(topic)})]
    with Admin(server.url) as admin:
        group = admin.describe_group(topic)
    assert {(o["partition"], o["offset"]) for o in group["offsets"]} == {(0, 3), (1, 3)}


def test_auto_commit_commits_the_positions_of_the_partitions_a_rebalance_revokes(server):
    """Regression: with enable_auto_commit (the default) and no on_revoke, a rebalance dropped the
    revoked partition's position without committing it, so its next owner read again every record
    poll() had handed out since the last auto-commit (up to auto_commit_interval_ms of them).
    Kafka's consumer commits before it revokes (the classic one's onJoinPrepare, KIP-848's
    autoCommitSyncBeforeRevocation)."""
    topic = "revoking-auto-commit"
    six_records_in_two_partitions(server, topic)
    config = {**MEMBER, "enable_auto_commit": True, "auto_commit_interval_ms": 60_000}
    first = Consumer(server.url, group_id=topic, **config)
    first.subscribe([topic])
    poll_until(first, 6)
    with Consumer(server.url, group_id=topic, **config) as second:
        second.subscribe([topic])
        deadline = time.monotonic() + 20
        while not (len(first.assignment()) == 1 and second.assignment()) and time.monotonic() < deadline:
            first.poll(timeout_ms=100)
            second.poll(timeout_ms=100)
        (taken,) = second.assignment()
        assert first.committed([taken]) == {taken: 3}, "the revoked partition's position was not committed"
        assert second.poll(timeout_ms=300) == [], "the new owner read again what the first had read"
        first.close()


def test_on_assign_runs_when_on_revoke_raised_and_poll_raises_on_revokes_error(server):
    """Regression: when on_revoke raised, poll() raised its error and on_assign was never called
    for the partitions that rebalance assigned (later polls returned their records all the same):
    an application that sets its partitions up in on_assign (a seek to offsets it stores, a
    state) read them without it. Kafka's consumer still calls onPartitionsAssigned, then raises
    the first listener's error (ConsumerCoordinator.onJoinComplete)."""
    first_topic, second_topic = "revoking-raises-a", "revoking-raises-b"
    with Admin(server.url) as admin:
        admin.create_topic(first_topic, partitions=1)
        admin.create_topic(second_topic, partitions=1)
    assigned: list = []

    def on_revoke(partitions: set[TopicPartition]) -> None:
        raise RuntimeError(f"on_revoke failed for {sorted(partitions)}")

    with Consumer(server.url, group_id="revoking-raises", **MEMBER) as consumer:
        consumer.subscribe([first_topic], on_assign=assigned.append, on_revoke=on_revoke)
        deadline = time.monotonic() + 20
        while not assigned and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        assert assigned == [{TopicPartition(first_topic, 0)}]
        consumer.subscribe([second_topic], on_assign=assigned.append, on_revoke=on_revoke)
        raised = None
        while raised is None and time.monotonic() < deadline:
            try:
                consumer.poll(timeout_ms=100)
            except RuntimeError as error:
                raised = error
        assert raised is not None and first_topic in str(raised), "on_revoke's error was not raised"
        assert consumer.assignment() == {TopicPartition(second_topic, 0)}
        assert assigned == [{TopicPartition(first_topic, 0)}, {TopicPartition(second_topic, 0)}], (
            "on_assign was not called after on_revoke raised"
        )
        consumer.subscribe([second_topic])  # close()'s on_revoke would raise too


def test_an_async_on_assign_runs_when_on_revoke_raised(server):
    """The same with an AsyncConsumer, whose poll() awaits the listeners on the event loop."""
    first_topic, second_topic = "revoking-raises-async-a", "revoking-raises-async-b"
    with Admin(server.url) as admin:
        admin.create_topic(first_topic, partitions=1)
        admin.create_topic(second_topic, partitions=1)
    assigned: list = []

    async def on_revoke(partitions: set[TopicPartition]) -> None:
        raise RuntimeError(f"on_revoke failed for {sorted(partitions)}")

    async def scenario() -> None:
        async with AsyncConsumer(server.url, group_id="revoking-raises-async", **MEMBER) as consumer:
            consumer.subscribe([first_topic], on_assign=assigned.append, on_revoke=on_revoke)
            async with asyncio.timeout(20):
                while not assigned:
                    await consumer.poll(timeout_ms=100)
                consumer.subscribe([second_topic], on_assign=assigned.append, on_revoke=on_revoke)
                raised = None
                while raised is None:
                    try:
                        await consumer.poll(timeout_ms=100)
                    except RuntimeError as error:
                        raised = error
            assert first_topic in str(raised)
            assert assigned == [{TopicPartition(first_topic, 0)}, {TopicPartition(second_topic, 0)}], (
                "on_assign was not called after on_revoke raised"
            )
            consumer.subscribe([second_topic])  # close()'s on_revoke would raise too

    asyncio.run(scenario())


def two_members_take_a_partition_from_the_first(first_poll, second_poll, revoked: list) -> None:
    """Polls both members until the first's on_revoke ran (the second member joined and took one)."""
    deadline = time.monotonic() + 20
    while not revoked and time.monotonic() < deadline:
        first_poll()
        second_poll()
    assert revoked, "no rebalance revoked a partition of the first member"


def assert_each_partition_revoked_once(revoked: list, topic: str) -> None:
    """The rebalance's on_revoke (one partition), then the leave's inside it (the other one)."""
    assert [len(partitions) for partitions in revoked] == [1, 1], f"on_revoke ran again: {revoked}"
    assert revoked[0] | revoked[1] == both_partitions(topic)


@pytest.mark.parametrize("leave", ["unsubscribe", "close"])
def test_unsubscribe_or_close_inside_on_revoke_does_not_run_on_revoke_again(server, leave):
    """Regression: an on_revoke that leaves the group (unsubscribe() or close(), e.g. on shutdown)
    was called again by that call, inside itself, for every assigned partition: the partitions it
    was revoking too, and so on (unbounded recursion). As Kafka's consumer, the listener is not
    called again for partitions it is revoking: the leave's on_revoke (inside the first) is for the
    partition the rebalance kept, and each partition is revoked once; the poll returns no record
    and calls no on_assign, and the other member takes every partition."""
    topic = f"revoking-leave-inside-{leave}"
    six_records_in_two_partitions(server, topic)
    revoked: list = []
    assigned: list = []
    first = Consumer(server.url, group_id=topic, **MEMBER)

    def on_revoke(partitions: set[TopicPartition]) -> None:
        revoked.append(set(partitions))
        getattr(first, leave)()

    first.subscribe([topic], on_revoke=on_revoke, on_assign=lambda partitions: assigned.append(set(partitions)))
    poll_until(first, 6)
    with Consumer(server.url, group_id=topic, **MEMBER) as second:
        second.subscribe([topic])
        two_members_take_a_partition_from_the_first(
            lambda: not revoked and first.poll(timeout_ms=100), lambda: second.poll(timeout_ms=100), revoked
        )
        assert_each_partition_revoked_once(revoked, topic)
        assert assigned == [both_partitions(topic)]
        deadline = time.monotonic() + 20
        while second.assignment() != both_partitions(topic) and time.monotonic() < deadline:
            second.poll(timeout_ms=100)
        assert second.assignment() == both_partitions(topic)
    first.close()  # after unsubscribe(): nothing left to revoke
    assert_each_partition_revoked_once(revoked, topic)


@pytest.mark.parametrize("leave", ["unsubscribe", "close"])
def test_an_async_unsubscribe_or_close_inside_on_revoke_does_not_run_on_revoke_again(server, leave):
    """As above, an AsyncConsumer whose (coroutine) on_revoke awaits unsubscribe() or close()."""
    topic = f"revoking-async-leave-inside-{leave}"
    six_records_in_two_partitions(server, topic)
    revoked: list = []

    async def scenario() -> None:
        first = AsyncConsumer(server.url, group_id=topic, **MEMBER)

        async def on_revoke(partitions: set[TopicPartition]) -> None:
            revoked.append(set(partitions))
            await getattr(first, leave)()

        first.subscribe([topic], on_revoke=on_revoke)
        await poll_async_until(first, 6)
        async with AsyncConsumer(server.url, group_id=topic, **MEMBER) as second:
            second.subscribe([topic])
            deadline = time.monotonic() + 20
            while not revoked and time.monotonic() < deadline:
                if not revoked:
                    await first.poll(timeout_ms=100)
                await second.poll(timeout_ms=100)
            assert_each_partition_revoked_once(revoked, topic)
            deadline = time.monotonic() + 20
            while second.assignment() != both_partitions(topic) and time.monotonic() < deadline:
                await second.poll(timeout_ms=100)
            assert second.assignment() == both_partitions(topic)
        await first.close()
        assert_each_partition_revoked_once(revoked, topic)

    asyncio.run(scenario())
