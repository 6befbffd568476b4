"""The real clients as members of a consumer group (subscribe, poll, commit, close), behind one
small interface so that a group test runs unchanged with each: confluent-kafka, kafka-python and
aiokafka (driven on an event loop of its own, run while the test polls it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.kafka.clients import WAIT_S, bootstrap


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    value: bytes | None


class ConfluentMember:
    def __init__(self, server, group: str, topic: str, reset: str = "earliest", **extra) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(server),
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": reset,
                **extra,
            }
        )
        # Each rebalance callback, in order: ("assign" | "revoke", partitions).
        self.rebalances: list[tuple[str, set[int]]] = []
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _, partitions: self.rebalances.append(("assign", {p.partition for p in partitions})),
            on_revoke=lambda _, partitions: self.rebalances.append(("revoke", {p.partition for p in partitions})),
        )

    def poll(self) -> list[Consumed]:
        message = self.consumer.poll(0.2)
        if message is None:
            return []
        assert message.error() is None or message.error().code() == KafkaError._PARTITION_EOF, message.error()
        if message.error():
            return []
        return [Consumed(message.partition(), message.offset(), message.value())]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def positions_known(self) -> bool:
        return all(tp.offset >= 0 for tp in self.consumer.position(self.consumer.assignment()))

    def commit(self, metadata: str | None = None) -> None:
        if metadata is None:
            self.consumer.commit(asynchronous=False)
            return
        positions = self.consumer.position(self.consumer.assignment())
        self.consumer.commit(
            offsets=[
                TopicPartition(tp.topic, tp.partition, tp.offset, metadata=metadata)
                for tp in positions
                if tp.offset >= 0
            ],
            asynchronous=False,
        )

    def committed(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, str | None]]:
        found = self.consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=WAIT_S)
        return {tp.partition: (tp.offset, tp.metadata) for tp in found}

    def close(self) -> None:
        self.consumer.close()


class KafkaPythonMember:
    """kafka-python rejoins a rebalance only inside poll(), so a thread of its own polls it all the
    time (as a process of its own would): a test driving two members then never leaves one unpolled
    while the other's JoinGroup waits for it to rejoin. Every other call runs on that thread between
    two polls (a KafkaConsumer is not thread-safe); what it polled waits in a queue for poll()."""

    POLL_MS = 100  # each poll()'s time on that thread: a rejoin that takes longer spans several polls

    def __init__(self, server, group: str, topic: str, reset: str = "earliest", **extra) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap(server),
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset=reset,
            # kafka-python's default session (10 s) lapsed once on a machine loaded by several test
            # suites, its heartbeats late: the group rebalanced and a commit got REBALANCE_IN_PROGRESS.
            # No test here lets a kafka-python member's session expire (they leave by close()).
            **{"session_timeout_ms": 30_000, **extra},
        )
        self.consumer.subscribe([topic])
        # The subscribed topic's metadata, fetched now (topics() always asks the broker), before the
        # first JoinGroup. Its leader assigns with it ("No partition metadata" otherwise; Kafka's
        # initial rebalance delay, 3 s but 0 in the test servers, lets a real group fetch it), and
        # kafka-python rejoins when the metadata its leader assigned with differs from what it holds
        # now: a rejoin that no broker asked for, and kafka-python 3.0 can lose it. If that rejoin's
        # poll() times out once the JoinGroup is answered (its SyncGroup still on the way), the next
        # poll() finds no reason to rejoin and never takes the answer: the member stays
        # "rebalancing" with its heartbeats stopped and its old partitions, never hearing of the
        # next rebalance. Fetched after subscribe(), the metadata it first assigns with is current.
        assert topic in self.consumer.topics()
        self.topic = topic
        self._calls: queue.Queue = queue.Queue()
        self._polled: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._own_the_consumer, daemon=True)
        self._thread.start()

    def _own_the_consumer(self) -> None:
        while not self._closed:
            try:
                call, answer = self._calls.get_nowait()
            except queue.Empty:
                try:
                    found = self.consumer.poll(timeout_ms=self.POLL_MS)
                except Exception as error:  # handed to the test at its next poll()
                    self._polled.put(error)
                    continue
                for records in found.values():
                    for r in records:
                        self._polled.put(Consumed(r.partition, r.offset, r.value))
                continue
            try:
                answer.set_result(call())
            except Exception as error:
                answer.set_exception(error)

    def _run(self, call):
        answer: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((call, answer))
        return answer.result(WAIT_S)

    def poll(self) -> list[Consumed]:
        found = []
        try:
            found.append(self._polled.get(timeout=0.2))
            while True:
                found.append(self._polled.get_nowait())
        except queue.Empty:
            pass
        for item in found:
            if isinstance(item, Exception):
                raise item
        return found

    def assignment(self) -> set[int]:
        return self._run(lambda: {tp.partition for tp in self.consumer.assignment()})

    def positions_known(self) -> bool:
        return self._run(lambda: all(self.consumer.position(tp) is not None for tp in self.consumer.assignment()))

    def commit(self, metadata: str | None = None) -> None:
        """Commits the positions: every record polled so far (the test's poll() may not have taken
        the last of them yet)."""
        if metadata is None:
            self._run(self.consumer.commit)
            return
        from kafka.structs import OffsetAndMetadata

        self._run(
            lambda: self.consumer.commit(
                {tp: OffsetAndMetadata(self.consumer.position(tp), metadata, -1) for tp in self.consumer.assignment()}
            )
        )

    def committed(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, str | None]]:
        from kafka import TopicPartition as KafkaPythonPartition

        def read():
            found = {}
            for p in partitions:
                meta = self.consumer.committed(KafkaPythonPartition(topic, p), metadata=True)
                found[p] = (-1001, None) if meta is None else (meta.offset, meta.metadata)
            return found

        return self._run(read)

    def close(self) -> None:
        def close_and_stop_polling():
            self._closed = True
            self.consumer.close()

        try:
            self._run(close_and_stop_polling)
        finally:
            self._closed = True
            self._thread.join(WAIT_S)


class AioKafkaMember:
    """Its event loop runs in a thread of its own, so that its heartbeats and rejoins go on while
    the test waits on another member (as two processes would)."""

    def __init__(self, server, group: str, topic: str, reset: str = "earliest", **extra) -> None:
        from aiokafka import AIOKafkaConsumer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start():
            consumer = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bootstrap(server),
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset=reset,
                **extra,
            )
            await consumer.start()
            return consumer

        self.consumer = self._run(start())

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(WAIT_S)

    def poll(self) -> list[Consumed]:
        found = self._run(self.consumer.getmany(timeout_ms=200))
        return [Consumed(r.partition, r.offset, r.value) for records in found.values() for r in records]

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def positions_known(self) -> bool:
        async def resolve():
            return all([await self.consumer.position(tp) >= 0 for tp in self.consumer.assignment()])

        return self._run(resolve())

    def commit(self, metadata: str | None = None) -> None:
        if metadata is None:
            self._run(self.consumer.commit())
            return

        async def commit_with_metadata():
            offsets = {tp: (await self.consumer.position(tp), metadata) for tp in self.consumer.assignment()}
            await self.consumer.commit(offsets)

        self._run(commit_with_metadata())

    def committed(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, str | None]]:
        from aiokafka import TopicPartition as AioPartition

        async def read():
            found = {}
            for p in partitions:
                offset = await self.consumer.committed(AioPartition(topic, p))
                found[p] = (-1001 if offset is None else offset, None)
            return found

        return self._run(read())

    def close(self) -> None:
        try:
            self._run(self.consumer.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.loop.close()


MEMBERS = {"confluent-kafka": ConfluentMember, "kafka-python": KafkaPythonMember, "aiokafka": AioKafkaMember}


def poll_until(members, condition, what: str) -> list[list[Consumed]]:
    """Polls every member (each keeps its group membership alive) until condition(consumed) holds;
    consumed: what each member received, in order."""
    consumed: list[list[Consumed]] = [[] for _ in members]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for index, member in enumerate(members):
            consumed[index].extend(member.poll())
        if condition(consumed):
            return consumed
    raise AssertionError(f"not reached within {WAIT_S} s: {what}; consumed so far {consumed}")
