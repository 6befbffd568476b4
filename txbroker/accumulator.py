"""Records waiting to be sent, batched per partition (Kafka's RecordAccumulator), and the default
partitioner's choice for records without a partition.

Thread-safe: `append` may be called from any thread (the synchronous Producer's callers) while the
sender drains on the event loop. One lock guards the queues; it is never held across I/O.

A batch is ready when it is full (`batch_size` bytes or `max_batch_records` records), when it has
waited `linger_ms`, when it is not the last of its partition, or when a flush is in progress.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txbroker.errors import TxbrokerError
from txbroker.records import RecordMetadata, TopicPartition
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, partition_for_key


class RecordFuture:
    """The future of one record's RecordMetadata, a view on its batch's future: one future per batch
    (creating a concurrent.futures.Future costs more than encoding the record), as Kafka's
    FutureRecordMetadata. `result(timeout)` blocks (synchronous Producer); `await` it (AsyncProducer)."""

    __slots__ = ("_future", "_tp", "_index")

    def __init__(self, future: Any, tp: TopicPartition, index: int) -> None:
        self._future, self._tp, self._index = future, tp, index

    def _metadata(self, base_offset: int) -> RecordMetadata:
        return RecordMetadata(self._tp.topic, self._tp.partition, base_offset + self._index)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        base = self._future.result() if timeout is None else self._future.result(timeout)
        return self._metadata(base)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception() if timeout is None else self._future.exception(timeout)

    def add_done_callback(self, callback: Callable[[RecordFuture], Any]) -> None:
        self._future.add_done_callback(lambda _: callback(self))

    def __await__(self):
        base = yield from self._future.__await__()
        return self._metadata(base)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<RecordFuture {self._tp.topic}-{self._tp.partition} #{self._index} {state}>"


@dataclass(eq=False)
class ProducerBatch:
    """Records of one partition sent in one produce request entry. Once sent, a batch keeps its
    (producer id, epoch, base sequence) across retries: the server recognizes a retry as a duplicate."""

    tp: TopicPartition
    created: float
    future: Any  # of the base offset
    records: list[dict] = field(default_factory=list)
    size: int = 0
    base_sequence: int = NO_SEQUENCE
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    attempts: int = 0
    done: bool = False
    # Failed at delivery_timeout_ms with its request in flight (Sender._expire_in_flight): the
    # request's answer only tells the sequence, and whether its records were written after all.
    expired_in_flight: bool = False
    # The sender has acted on its request's end (answered, refused, or its outcome unknown): not
    # `done`, which an in-flight batch is from its expiry on.
    settled: bool = False

    def complete(self, base_offset: int) -> None:
        self.done = self.settled = True
        if not self.future.done():
            self.future.set_result(base_offset)

    def settle_failed(self, error: TxbrokerError) -> None:
        """The sender's last word on a batch it sent: failed with `error` (unless it failed already,
        at its delivery timeout)."""
        self.settled = True
        self.fail(error)

    def fail(self, error: TxbrokerError) -> None:
        self.done = True
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # retrieved: the error also reaches the transaction or flush()


class RecordAccumulator:
    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: float,
        max_batch_records: int,
        max_buffered_records: int,
        future_factory: Callable[[], Any],
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.max_batch_records = max_batch_records
        self.max_buffered_records = max_buffered_records
        self.future_factory = future_factory
        self._lock = threading.Lock()
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._buffered = 0
        self._sticky: dict[str, int] = {}
        self._round_robin: dict[str, itertools.count] = {}
        self._sticky_counts: dict[str, int] = {}
        self.flushing = 0

    # ---- partitioner

    def choose_partition(self, topic: str, key: bytes | None, partition_count: int) -> int:
        """Kafka's default partitioner: murmur2 of the key; without a key, stick to one partition
        until its batch is sent (KIP-480), then move on round-robin."""
        if key is not None:
            return partition_for_key(key, partition_count)
        with self._lock:
            sticky = self._sticky.get(topic)
            if sticky is None or self._sticky_counts.get(topic) != partition_count:
                sticky = self._next_sticky(topic, partition_count)
            return sticky

    def _next_sticky(self, topic: str, partition_count: int) -> int:
        counter = self._round_robin.setdefault(topic, itertools.count())
        self._sticky[topic] = next(counter) % partition_count
        self._sticky_counts[topic] = partition_count
        return self._sticky[topic]

    # ---- appending

    def has_room(self) -> bool:
        return self._buffered < self.max_buffered_records

    def append(self, tp: TopicPartition, record: dict, size: int) -> tuple[RecordFuture, bool]:
        """Adds a record; returns its future and whether the sender should be woken (the first
        record of an idle accumulator starts a linger timer; a full batch is ready now)."""
        with self._lock:
            queue = self._queues.get(tp)
            if queue is None:
                queue = self._queues[tp] = deque()
            batch = queue[-1] if queue else None
            if batch is None or self._full(batch, size):
                batch = ProducerBatch(tp, time.monotonic(), self.future_factory())
                queue.append(batch)
            future = RecordFuture(batch.future, tp, len(batch.records))
            batch.records.append(record)
            batch.size += size
            self._buffered += 1
            first = self._buffered == 1
            full = self._full(batch, 0)
            if full and self._sticky.get(tp.topic) == tp.partition:
                self._next_sticky(tp.topic, self._sticky_counts.get(tp.topic, 1))
        return future, first or full

    def _full(self, batch: ProducerBatch, extra: int) -> bool:
        return len(batch.records) >= self.max_batch_records or (
            bool(batch.records) and batch.size + extra > self.batch_size
        )

    # ---- draining

    def drain(self, now: float, busy: set[TopicPartition], max_records: int) -> list[ProducerBatch]:
        """The first batch of each ready partition not in `busy` (one batch per partition in flight
        keeps sequences in order), up to about `max_records` records in all."""
        taken: list[ProducerBatch] = []
        count = 0
        with self._lock:
            for tp, queue in self._queues.items():
                if not queue or tp in busy:
                    continue
                batch = queue[0]
                if not (
                    self.flushing or len(queue) > 1 or self._full(batch, 0) or now - batch.created >= self.linger_s
                ):
                    continue
                if taken and count + len(batch.records) > max_records:
                    break
                queue.popleft()
                taken.append(batch)
                count += len(batch.records)
                self._buffered -= len(batch.records)
                if not queue and self._sticky.get(tp.topic) == tp.partition:
                    self._next_sticky(tp.topic, self._sticky_counts.get(tp.topic, 1))
        return taken

    def next_ready_in(self, now: float, busy: set[TopicPartition]) -> float | None:
        """Seconds until some batch becomes ready by lingering (0: one is ready), None if empty."""
        soonest = None
        with self._lock:
            for tp, queue in self._queues.items():
                if not queue or tp in busy:
                    continue
                batch = queue[0]
                if self.flushing or len(queue) > 1 or self._full(batch, 0):
                    return 0.0
                wait = max(0.0, batch.created + self.linger_s - now)
                soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def expire(self, now: float, delivery_timeout_s: float) -> list[ProducerBatch]:
        """Removes and returns the batches that have waited delivery_timeout_s since their first
        record, whatever held them back (Kafka's expiredBatches): the partition's batch in flight,
        every request slot taken, a lingering batch. None of them was sent, so none has a sequence."""
        expired: list[ProducerBatch] = []
        with self._lock:
            for queue in self._queues.values():
                while queue and now - queue[0].created >= delivery_timeout_s:
                    batch = queue.popleft()
                    self._buffered -= len(batch.records)
                    expired.append(batch)
        return expired

    def next_expiry_in(self, now: float, delivery_timeout_s: float) -> float | None:
        """Seconds until the oldest waiting batch expires, None if none waits."""
        with self._lock:
            oldest = min((queue[0].created for queue in self._queues.values() if queue), default=None)
        return None if oldest is None else max(0.0, oldest + delivery_timeout_s - now)

    def unsent(self) -> list[ProducerBatch]:
        with self._lock:
            return [batch for queue in self._queues.values() for batch in queue]

    def fail_all(self, error: TxbrokerError) -> int:
        """Fails every batch not yet sent (an abort, a fatal error, close without flush)."""
        with self._lock:
            batches = [batch for queue in self._queues.values() for batch in queue]
            for queue in self._queues.values():
                queue.clear()
            self._buffered = 0
        for batch in batches:
            batch.fail(error)
        return len(batches)

    @property
    def buffered_records(self) -> int:
        return self._buffered

    def now(self) -> float:
        return time.monotonic()
