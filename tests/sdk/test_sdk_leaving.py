"""A consumer leaving its group, by close() and unsubscribe(), against real servers (real HTTP, real
PostgreSQL): on_revoke runs first, as Kafka's consumer runs onPartitionsRevoked before it leaves,
so the application commits its work once more; close() ends within its timeout whatever the server
does."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from tests.sdk.test_sdk_faults import produce_values
from tests.sdk.test_sdk_integration import FAST
from txbroker import Admin, AsyncConsumer, Consumer, TopicPartition


def poll_until(consumer: Consumer, count: int) -> list:
    received: list = []
    deadline = time.monotonic() + 20
    while len(received) < count and time.monotonic() < deadline:
        received += consumer.poll(timeout_ms=500)
    assert len(received) == count
    return received


async def poll_async_until(consumer: AsyncConsumer, count: int) -> list:
    """poll_until's AsyncConsumer twin."""
    received: list = []
    deadline = time.monotonic() + 20
    while len(received) < count and time.monotonic() < deadline:
        received += await consumer.poll(timeout_ms=500)
    assert len(received) == count
    return received


def next_offsets(records: list) -> dict[TopicPartition, int]:
    return {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}


def test_close_runs_on_revoke_on_the_callers_thread_where_the_work_is_committed(server):
    """close() of a subscribed consumer runs on_revoke(every assigned partition) before it leaves
    the group, on the caller's thread, where the listener commits what was processed (as Kafka's
    onPartitionsRevoked at close); the group is then left, its offsets those the listener
    committed. Before, close() left without running it: the work done since the last commit was
    processed again by the partitions' next owner."""
    topic = "leaving-close"
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=2)
    produce_values(server.url, topic, [f"r{i}" for i in range(6)], partitions=2)
    processed: dict[TopicPartition, int] = {}
    revoked: list = []
    consumer = Consumer(server.url, group_id=topic, auto_offset_reset="earliest", enable_auto_commit=False, **FAST)

    def on_revoke(partitions: set[TopicPartition]) -> None:
        revoked.append((set(partitions), threading.current_thread()))
        consumer.commit({tp: offset for tp, offset in processed.items() if tp in partitions})

    consumer.subscribe([topic], on_revoke=on_revoke)
    processed.update(next_offsets(poll_until(consumer, 6)))
    consumer.close()
    assert revoked == [({TopicPartition(topic, 0), TopicPartition(topic, 1)}, threading.current_thread())]
    with Admin(server.url) as admin:
        group = admin.describe_group(topic)
    assert group["members"] == []
    assert {(o["partition"], o["offset"]) for o in group["offsets"]} == {(0, 3), (1, 3)}


def test_unsubscribe_runs_on_revoke_and_leaves_even_when_the_listener_raises(server):
    """unsubscribe() of an AsyncConsumer awaits its (async) on_revoke, which commits and then
    raises: the commit is kept, the group is left and the consumer unsubscribed all the same, and
    the listener's error is what unsubscribe() raises (Kafka's new consumer leaves whatever its
    listener does). Before, unsubscribe() left without running the listener."""
    topic = "leaving-unsubscribe"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    produce_values(server.url, topic, ["a", "b", "c"])
    revoked: list[set[TopicPartition]] = []

    async def main() -> None:
        async with AsyncConsumer(
            server.url, group_id=topic, auto_offset_reset="earliest", enable_auto_commit=False, **FAST
        ) as consumer:

            async def on_revoke(partitions: set[TopicPartition]) -> None:
                revoked.append(set(partitions))
                await consumer.commit()  # the positions: past what poll() handed out
                raise RuntimeError("the listener failed after committing")

            consumer.subscribe([topic], on_revoke=on_revoke)
            received: list = []
            deadline = time.monotonic() + 20
            while len(received) < 3 and time.monotonic() < deadline:
                received += await consumer.poll(timeout_ms=500)
            assert len(received) == 3
            with pytest.raises(RuntimeError, match="the listener failed after committing"):
                await consumer.unsubscribe()
            assert consumer.assignment() == set() and consumer.subscription() == set()

    asyncio.run(main())
    assert revoked == [{TopicPartition(topic, 0)}]
    with Admin(server.url) as admin:
        group = admin.describe_group(topic)
    assert group["members"] == [], "left, although the listener raised"
    assert [(o["partition"], o["offset"]) for o in group["offsets"]] == [(0, 3)]


def test_close_ends_within_its_timeout_while_the_server_is_frozen(server_process, database_url):
    """close(timeout) of an auto-committing group member whose server is frozen (SIGSTOP) ends
    within about its timeout, as Kafka's close(Duration) (30 s by default): the final auto-commit
    and the leave the server does not answer in time are given up; on_revoke still runs. Before,
    close() had no timeout: it retried the final commit for default_api_timeout_ms and waited
    request_timeout_ms for the leave (here 20 s each)."""
    server = server_process("--database-url", database_url)
    topic = "frozen-leave"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    produce_values(server.url, topic, ["a", "b"])
    revoked: list[set[TopicPartition]] = []
    consumer = Consumer(
        server.url,
        group_id=topic,
        auto_offset_reset="earliest",
        request_timeout_ms=20_000,
        default_api_timeout_ms=20_000,
        **FAST,
    )
    consumer.subscribe([topic], on_revoke=revoked.append)
    poll_until(consumer, 2)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        consumer.close(timeout=1)
        took = time.monotonic() - started
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert took < 5, f"close(timeout=1) took {took:.1f} s with the server frozen"
    assert revoked == [{TopicPartition(topic, 0)}]
