"""The exactly-once loops of the transaction tests, with confluent-kafka as applications write them:
a consume-transform-produce loop (read_committed input, transactional output, the input offsets
committed in the same transaction with send_offsets_to_transaction), and transactional producers
that retry a transaction until it is known committed. Both recover from any error the way Kafka's
documentation says: a new producer instance (its InitProducerId fences the old one and completes or
aborts its transaction), then resume from what is committed. `server` is anything with an HTTP
`client` and `extra["kafka_bootstrap"]`; a test may swap its client when it restarts the node.

The consumer is assigned its partitions at the committed offsets, read over HTTP (OffsetFetch over
Kafka is the consumer-groups slice of issue 23); send_offsets_to_transaction works without joining
the group (generation -1, as Kafka accepts)."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

import httpx
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, ConfluentKafka, bootstrap, create_topic

POLL_S = 0.2  # between polls of a condition the server must reach
TRANSFORMED_PREFIX = b"t:"
BATCH = 20  # the most records one transaction of the loop processes
SEND_OFFSETS_WATCHDOG_S = 20  # a call that takes milliseconds, seconds across a restart


class AbandonedInstance(Exception):
    """A client call that never returned: the instance is replaced, as after a fatal error."""


def _send_offsets(producer: Producer, offsets: list[TopicPartition], group_metadata) -> None:
    """send_offsets_to_transaction, given up on after SEND_OFFSETS_WATCHDOG_S: librdkafka ignores its
    timeout there and can block for good once the group coordinator was down during a transaction
    (confluentinc/librdkafka#5456 and #5511, open). A new instance's InitProducerId then fences the
    stuck one and aborts its transaction, which is what makes abandoning it safe."""
    finished = threading.Event()
    failure: list[KafkaException] = []

    def call():
        try:
            producer.send_offsets_to_transaction(offsets, group_metadata, WAIT_S)
        except KafkaException as error:
            failure.append(error)
        finally:
            finished.set()

    threading.Thread(target=call, daemon=True).start()
    if not finished.wait(SEND_OFFSETS_WATCHDOG_S):
        raise AbandonedInstance(f"send_offsets_to_transaction did not return in {SEND_OFFSETS_WATCHDOG_S} s")
    if failure:
        raise failure[0]


def transformed(value: bytes) -> bytes:
    return TRANSFORMED_PREFIX + value


def guarded_thread(target: Callable, errors: list[BaseException], **kwargs) -> threading.Thread:
    """A daemon thread (not started) that runs target(**kwargs) and appends what it raises to `errors`,
    for the test to assert on."""

    def run():
        try:
            target(**kwargs)
        except BaseException as error:  # surfaced by the test's assertion
            errors.append(error)

    return threading.Thread(target=run, daemon=True)


def stacks_of_the_living(threads: list[threading.Thread]) -> list[str]:
    """Where each thread still running is: what a test shows when a client call never returned."""
    frames = sys._current_frames()
    return ["".join(traceback.format_stack(frames[t.ident])) for t in threads if t.is_alive() and t.ident in frames]


def wait_for_transactions(workers: list, at_least: int | list[int], errors: list, deadline: float) -> None:
    """Until each worker (a TransformLoop, a TransactionalWriter) has committed `at_least`
    transactions (one count for all, or one each), or is done."""
    targets = at_least if isinstance(at_least, list) else [at_least] * len(workers)
    while not all(w.committed_transactions >= t or w.done.is_set() for w, t in zip(workers, targets)):
        assert time.monotonic() < deadline and not errors, (errors, [w.seen for w in workers])
        time.sleep(0.001)  # a writer's transactions take a few ms: a test kills while most are to come


def fill_source(server, topic: str, count: int, partitions: int) -> dict[int, list[bytes]]:
    """`topic` created and filled with `count` records "in-{n}" by confluent-kafka's own partitioner:
    each partition's values in log order."""
    create_topic(server, topic, partitions)
    delivered = ConfluentKafka().produce(
        server, topic, [{"value": f"in-{n}".encode()} for n in range(count)], partitioner="murmur2_random"
    )
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for d in sorted(delivered, key=lambda d: (d.partition, d.offset)):
        by_partition[d.partition].append(d.value)
    return by_partition


def assert_transformed_once(server, source: dict[int, list[bytes]], sink: str, group: str, source_topic: str) -> None:
    """Every record of `source` (fill_source's) transformed exactly once into the same partition of
    `sink`, in order, read over HTTP and by read_committed Kafka consumers, and the group's offsets
    committed to the source's end."""
    for partition, values in source.items():
        expected = [transformed(v) for v in values]
        assert committed_values(server, sink, partition) == expected
        received = ConfluentKafka().consume(server, sink, partition, len(expected), isolation="read_committed")
        assert [r.value for r in received] == expected
    ends = {p: len(v) for p, v in source.items()}
    assert committed_offsets(server, group, source_topic, len(source)) == ends


def assert_each_transaction_once(server, writers: list[TransactionalWriter], topic: str, partitions: int) -> None:
    """Every transaction of the writers in `topic` once and whole (none twice, none partial), read
    over HTTP and by read_committed Kafka consumers."""
    for partition in range(partitions):
        values = committed_values(server, topic, partition)
        assert len(values) == len(set(values)), "a transaction was committed twice"
        expected = [v for w in writers for n in range(w.count) for p, v in w.values(n) if p == partition]
        assert sorted(values) == sorted(expected)  # every transaction once, none partial
        received = ConfluentKafka().consume(server, topic, partition, len(values), isolation="read_committed")
        assert sorted(r.value for r in received) == sorted(values)


def retrying(server, call: Callable):
    """`call(server)`, polled until the node answers (it may be restarting)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return call(server)
        except (httpx.HTTPError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def committed_offsets(server, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (0 where none), once no transaction holds one (require_stable)."""

    def fetch(server):
        response = server.client.post(
            f"/v1/groups/{group}/offsets/fetch",
            json={"partitions": [{"topic": topic, "partition": p} for p in range(partitions)], "require_stable": True},
        )
        assert response.status_code == 200, response.text
        entries = response.json()["offsets"]
        assert all(e["error"] is None for e in entries), entries  # UNSTABLE_OFFSET_COMMIT: poll again
        return {e["partition"]: max(e["offset"], 0) for e in entries}

    return retrying(server, fetch)


def committed_values(server, topic: str, partition: int) -> list[bytes]:
    return retrying(
        server, lambda s: [http_side.unb64(r["value"]) for r in http_side.fetch(s, topic, partition, "read_committed")]
    )


class TransformLoop:
    """Reads `source` (read_committed), writes each value transformed to the same partition of
    `sink`, and commits the input offsets with the output, a transaction per batch read. With
    `abort_every`, every so many transactions are aborted and their batch read again."""

    def __init__(
        self,
        server,
        source: str,
        sink: str,
        partitions: int,
        group: str,
        transactional_id: str,
        hold_after: int | None = None,
    ) -> None:
        self.server = server
        self.source, self.sink, self.partitions = source, sink, partitions
        self.group, self.transactional_id = group, transactional_id
        self.committed_transactions = 0
        self.aborted_transactions = 0
        self.recoveries = 0
        self.stop = threading.Event()  # set by a test that gives up: the loop returns
        self.done = threading.Event()  # set once `run` returns
        self.seen: list[str] = []  # the errors it recovered from, for a failing test to show
        self.idle_at: list[tuple[int, int]] = []  # its positions when it last found nothing to read
        # Held by a test while the node is down, so that the loop does not call
        # send_offsets_to_transaction then (see _send_offsets).
        self.offsets_gate = threading.Lock()
        # With hold_after: once that many transactions are committed, the loop waits for `go`
        # before reading more (as TransactionalWriter's).
        self.hold_after = hold_after
        self.go = threading.Event()

    def _session(self) -> tuple[Producer, Consumer]:
        producer = Producer({"bootstrap.servers": bootstrap(self.server), "transactional.id": self.transactional_id})
        producer.init_transactions(WAIT_S)
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(self.server),
                "group.id": self.group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        start = committed_offsets(self.server, self.group, self.source, self.partitions)
        consumer.assign([TopicPartition(self.source, p, start[p]) for p in range(self.partitions)])
        return producer, consumer

    def run(self, total: int, abort_every: int | None = None) -> None:
        """Until `total` input records are committed as processed."""
        try:
            self._run(total, abort_every)
        finally:
            self.done.set()

    def _run(self, total: int, abort_every: int | None) -> None:
        producer = consumer = None
        while not self.stop.is_set():
            if self.committed_transactions == self.hold_after:
                while not self.go.wait(POLL_S) and not self.stop.is_set():
                    pass
            try:
                if producer is None:
                    producer, consumer = self._session()
                    if sum(committed_offsets(self.server, self.group, self.source, self.partitions).values()) >= total:
                        return
                polled = consumer.consume(BATCH, 1)
                self.seen.extend(str(m.error()) for m in polled if m.error() is not None)
                messages = [m for m in polled if m.error() is None]
                if not messages:
                    self.idle_at = [(tp.partition, tp.offset) for tp in consumer.position(consumer.assignment())]
                    continue
                producer.begin_transaction()
                next_offsets: dict[int, int] = {}
                for message in messages:
                    producer.produce(self.sink, value=transformed(message.value()), partition=message.partition())
                    next_offsets[message.partition()] = message.offset() + 1
                with self.offsets_gate:
                    _send_offsets(
                        producer,
                        [TopicPartition(self.source, p, o) for p, o in next_offsets.items()],
                        consumer.consumer_group_metadata(),
                    )
                if abort_every and (self.committed_transactions + self.aborted_transactions + 1) % abort_every == 0:
                    producer.flush(WAIT_S)  # its records in the log, for read_committed to hide
                    producer.abort_transaction(WAIT_S)
                    self.aborted_transactions += 1
                    consumer.close()
                    producer = consumer = None  # read the batch again, from the committed offsets
                    continue
                producer.commit_transaction(WAIT_S)
                self.committed_transactions += 1
                if sum(committed_offsets(self.server, self.group, self.source, self.partitions).values()) >= total:
                    consumer.close()
                    return
            except (KafkaException, AbandonedInstance) as error:
                self.seen.append(str(error))
                # Whatever happened, a new instance resolves it: its InitProducerId completes a
                # decided transaction or aborts an open one, and the offsets say where to resume.
                self.recoveries += 1
                if consumer is not None:
                    consumer.close()
                producer = consumer = None


class TransactionalWriter:
    """Writes `count` transactions of `size` records, "w{name}-{n}-{i}", record i to partition
    i % partitions, each retried until known committed: after an error, a new instance, then the
    transaction written again only if it is not committed already."""

    def __init__(
        self, server, name: str, topic: str, partitions: int, count: int, size: int = 3, hold_after: int | None = None
    ) -> None:
        self.server, self.name, self.topic, self.partitions = server, name, topic, partitions
        self.count, self.size = count, size
        self.acknowledged: list[int] = []  # transactions whose commit_transaction returned
        self.done = threading.Event()  # set once `run` returns
        self.recoveries = 0
        self.stop = threading.Event()  # set by a test that gives up: the writer returns
        # With hold_after: once that many transactions are written, the writer waits for `go` before
        # the next, so that a test can have it mid-way at a moment of its choosing, however fast
        # the machine writes the rest.
        self.hold_after = hold_after
        self.go = threading.Event()
        self.seen: list[str] = []  # the errors it recovered from, for a failing test to show

    def values(self, n: int) -> list[tuple[int, bytes]]:
        return [(i % self.partitions, f"w{self.name}-{n}-{i}".encode()) for i in range(self.size)]

    def _committed(self, n: int) -> bool:
        partition, value = self.values(n)[0]
        return value in committed_values(self.server, self.topic, partition)

    @property
    def committed_transactions(self) -> int:
        return len(self.acknowledged)

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.done.set()

    def _run(self) -> None:
        producer = None
        n = 0
        while n < self.count and not self.stop.is_set():
            if n == self.hold_after:
                while not self.go.wait(POLL_S) and not self.stop.is_set():
                    pass
            try:
                if producer is None:
                    producer = Producer(
                        {"bootstrap.servers": bootstrap(self.server), "transactional.id": f"writer-{self.name}"}
                    )
                    producer.init_transactions(WAIT_S)
                    if self.recoveries and self._committed(n):  # its commit landed before the error
                        n += 1
                        continue
                producer.begin_transaction()
                for partition, value in self.values(n):
                    producer.produce(self.topic, value=value, partition=partition)
                producer.commit_transaction(WAIT_S)
                self.acknowledged.append(n)
                n += 1
            except KafkaException as error:
                self.seen.append(str(error))
                self.recoveries += 1
                producer = None


class AcknowledgedWriter:
    """An idempotent (not transactional) acks=all producer writing "i-{n}" to partition 0 of
    `topic`, one message every few ms, until `stop`; then it flushes. `delivered` and `failed` are
    its delivery reports."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
        self.topic = topic
        self.sent = 0
        self.delivered: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self.unflushed = None
        self.stop = threading.Event()

    def _reported(self, error, message) -> None:
        if error is None:
            self.delivered.append(message.value())
        else:
            self.failed.append((message.value(), str(error)))

    def run(self) -> None:
        while not self.stop.is_set():
            self.producer.produce(self.topic, value=f"i-{self.sent}".encode(), partition=0, on_delivery=self._reported)
            self.sent += 1
            self.producer.poll(0.01)
        self.unflushed = self.producer.flush(WAIT_S)

    def wait_for_deliveries(self, count: int, errors: list, deadline: float) -> None:
        """Until `count` messages are reported delivered."""
        while len(self.delivered) < count:
            assert time.monotonic() < deadline and not errors, (errors, self.failed[:5])
            time.sleep(0.01)

    def assert_each_sent_delivered_once(self, server) -> None:
        """Once it is done: every message sent reported delivered (none failed), and each in the log
        once, in the order produced, read over HTTP."""
        assert self.failed == [] and self.unflushed == 0
        sent = [f"i-{n}".encode() for n in range(self.sent)]
        assert self.delivered == sent
        assert committed_values(server, self.topic, 0) == sent
