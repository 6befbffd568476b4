"""The confluent-kafka clients of the Kafka benchmark, as functions run in client subprocesses
(bench.timed_run.ClientProcesses, driven by bench/kafka/client_runs.py): each takes plain,
picklable arguments and returns what it measured.

Every timed function first connects and warms up (metadata, producer id, InitProducerId), then
waits at its Window (a barrier of every client process and the bench) so that all begin
together whatever their warm-up took, works for the window's time and reports what completed and
when (time.monotonic(), shared by every process of a machine). The clients' own threads
(librdkafka's) do the network work with the GIL released; the Python calls per record or per
transaction are what the client processes' CPU column shows.
"""

from __future__ import annotations

import operator
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

# Generous: a wait must never be what ends a run.
WAIT_S = 60
# produce() calls between two looks at the clock (and at the delivery queue).
PRODUCE_CHUNK = 1000
# The nice value added to the processes of the producers that saturate the server (produce_records,
# section 1). While a connection has max.in.flight requests unanswered and more records ready,
# librdkafka's broker thread (2.16) spins: poll() with a timeout of 0, several times the CPU of the
# Python produce() calls, however deep the queue is kept (measured in docs/performance.md, "The
# clients' share was waste"). On the bench's machine those cores are the server's and PostgreSQL's,
# which a real deployment's clients, elsewhere, would not take: at the lowest priority the clients
# still get every idle cycle (they keep the server saturated) but no longer delay the server or
# PostgreSQL. transact_records (section 3) has a transaction's records in a request or two, seldom
# five in flight, and at this priority its waits for the cores would count in its transactions' time.
SATURATING_PRODUCER_NICENESS = 19


@dataclass(frozen=True)
class ClientRun:
    """What one client process measured."""

    records: int
    operations: int  # transactions (or, for plain producers, produce() calls)
    started_at: float  # time.monotonic() when its measured time began
    finished_at: float  # time.monotonic() when its last acknowledged write completed
    cpu_s: float  # of the whole process (librdkafka's threads included), from start_at to finished_at
    latencies_s: list[float] = field(default_factory=list)  # per transaction, when they are timed


@dataclass(frozen=True)
class Window:
    """When a timed client works: after `barrier` (a multiprocessing manager's, shared with the
    bench) lets every party through, `warmup_s` unmeasured, then `seconds` measured."""

    barrier: object  # a multiprocessing.managers.BarrierProxy
    warmup_s: float
    seconds: float

    def open(self, warm_up: bool = True) -> tuple[float, float]:
        """Waits for every party; returns (start_at, end_at) of the measured time, which begins
        after warmup_s, or at once without `warm_up`."""
        try:
            self.barrier.wait(WAIT_S)
        except Exception as error:
            raise RuntimeError(f"the other clients did not get ready within {WAIT_S} s ({error!r})") from error
        start_at = time.monotonic() + (self.warmup_s if warm_up else 0)
        return start_at, start_at + self.seconds

    def abort(self) -> None:
        """A party that cannot start: the others stop waiting (BrokenBarrierError) at once."""
        self.barrier.abort()


def producer_config(bootstrap: str, **extra) -> dict:
    """The producer of the issue's proof: acks=all, idempotent, linger.ms 5; delivery reports only
    for failures (a run with any failure is refused)."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "delivery.report.only.error": True,
        **extra,
    }


class _Failures:
    """Counts failed deliveries (the only ones reported) and keeps the first."""

    def __init__(self) -> None:
        self.count = 0
        self.first: KafkaError | None = None

    def __call__(self, error, _message) -> None:
        if error is not None:
            self.count += 1
            self.first = self.first or error

    def check(self, what: str) -> None:
        if self.count:
            raise RuntimeError(f"{what}: {self.count} records failed, the first with {self.first}")


def _flush(producer: Producer, failures: _Failures, what: str) -> None:
    left = producer.flush(WAIT_S)
    if left:
        raise RuntimeError(f"{what}: {left} records still undelivered after {WAIT_S} s")
    failures.check(what)


def _sleep_until(instant: float) -> None:
    time.sleep(max(instant - time.monotonic(), 0))


def _ready(window: Window, warm_up) -> object:
    """warm_up(), then the window's start; the window is aborted if warm_up fails."""
    try:
        return warm_up()
    except BaseException:
        window.abort()
        raise


def _idempotent_producer(bootstrap: str, topic: str, partition: int, value: bytes, failures: _Failures) -> Producer:
    producer = Producer(producer_config(bootstrap, on_delivery=failures))
    producer.produce(topic, value, partition=partition)  # warm-up: connections, producer id
    _flush(producer, failures, "warm-up produce")
    return producer


def produce_records(bootstrap: str, topic: str, partition: int, value_bytes: int, window: Window) -> ClientRun:
    """An idempotent producer writing `value_bytes`-byte records to one partition as fast as the
    client's queue takes them, for the window's time (no warm-up time: records sent before the
    window would be acknowledged in it), then flushing: the records count once acknowledged, by the
    time the flush returns."""
    failures = _Failures()
    value = b"v" * value_bytes
    producer = _ready(window, partial(_idempotent_producer, bootstrap, topic, partition, value, failures))
    start_at, end_at = window.open(warm_up=False)
    cpu_start = time.process_time()
    records = 0
    while time.monotonic() < end_at:
        for _ in range(PRODUCE_CHUNK):
            try:
                producer.produce(topic, value, partition=partition)
            except BufferError:  # the client's queue is full: let it deliver
                producer.poll(0.001)  # sleeps the millisecond (no delivery reports but failures): no spin
                continue
            records += 1
        producer.poll(0)
    _flush(producer, failures, f"producer of {topic}-{partition}")
    return ClientRun(records, records, start_at, time.monotonic(), time.process_time() - cpu_start)


def transact_records(
    bootstrap: str,
    topic: str,
    partition: int,
    value_bytes: int,
    records_per_transaction: int,
    window: Window,
) -> ClientRun:
    """A transactional producer (same settings) committing transactions of `records_per_transaction`
    records to one partition, one after the other, from the window's start (no warm-up time, as
    produce_records) until its end, finishing the one begun."""
    failures = _Failures()
    producer = _ready(window, partial(_transactional_producer, bootstrap, f"{topic}-{partition}", failures))
    value = b"v" * value_bytes
    start_at, end_at = window.open(warm_up=False)
    cpu_start = time.process_time()
    records = transactions = 0
    latencies = []
    while (started := time.monotonic()) < end_at:
        producer.begin_transaction()
        written = 0
        while written < records_per_transaction:
            try:
                producer.produce(topic, value, partition=partition)
                written += 1
            except BufferError:
                producer.poll(0.001)
        producer.commit_transaction(WAIT_S)
        failures.check(f"transactional producer of {topic}-{partition}")
        records += written
        transactions += 1
        latencies.append(time.monotonic() - started)
    return ClientRun(records, transactions, start_at, time.monotonic(), time.process_time() - cpu_start, latencies)


def _transactional_producer(bootstrap: str, transactional_id: str, failures: _Failures) -> Producer:
    producer = Producer(producer_config(bootstrap, on_delivery=failures, **{"transactional.id": transactional_id}))
    producer.init_transactions(WAIT_S)
    return producer


def transact_small(
    bootstrap: str, topic: str, producers: list[int], records_per_partition: tuple[int, ...], window: Window
) -> ClientRun:
    """Producers, each a thread of this process with its own confluent-kafka transactional
    producer (its own librdkafka instance and connections): producer p commits transactions of
    records_per_partition[i] 100-byte records to partition p * len(records_per_partition) + i.
    Threads, not a process each: between its calls into librdkafka a producer holds the GIL for a
    few microseconds per transaction, and commit_transaction waits with the GIL released, so the
    threads of a process hardly wait for each other; the client processes' CPU shows it. Counts the
    transactions whose commit returned inside the measured time."""
    failures = _Failures()

    def start(index: int) -> Producer:
        return _transactional_producer(bootstrap, f"{topic}-{index}", failures)

    with ThreadPoolExecutor(len(producers)) as threads:
        started = _ready(window, lambda: list(threads.map(start, producers)))
        start_at, end_at = window.open()
        runs = [
            threads.submit(_commit_small, producer, topic, index, records_per_partition, failures, start_at, end_at)
            for producer, index in zip(started, producers)
        ]
        _sleep_until(start_at)
        cpu_start = time.process_time()
        _sleep_until(end_at)
        cpu_s = time.process_time() - cpu_start
        latencies = [latency for run in runs for latency in run.result()]
    return ClientRun(len(latencies) * sum(records_per_partition), len(latencies), start_at, end_at, cpu_s, latencies)


def _commit_small(
    producer: Producer,
    topic: str,
    index: int,
    records_per_partition: tuple[int, ...],
    failures: _Failures,
    start_at: float,
    end_at: float,
) -> list[float]:
    """Transactions until end_at; the latencies of those that ended inside [start_at, end_at]."""
    first = index * len(records_per_partition)
    value = b"v" * 100
    latencies = []
    while (started := time.monotonic()) < end_at:
        producer.begin_transaction()
        for offset, count in enumerate(records_per_partition):
            for _ in range(count):
                producer.produce(topic, value, partition=first + offset)
        producer.commit_transaction(WAIT_S)
        failures.check(f"transactional producer {index}")
        done = time.monotonic()
        if start_at <= done <= end_at:
            latencies.append(done - started)
    return latencies


# librdkafka (2.4 and later) postpones a partition's next fetch by fetch.queue.backoff.ms, 1000 by
# default, whenever its local queue holds more than queued.min.messages: a consumer reading as fast
# as it can keeps it above that, so with the default it fetched a few times a second and sat idle
# in between, whatever broker answers, Kafka's too (librdkafka's statistics, in docs/performance.md,
# section 2 of "Today, on a quiet machine"). What a throughput-minded user sets instead (the
# setting's own documentation says to lower it when the queue thresholds bite); the queue
# thresholds themselves keep their defaults.
FETCH_QUEUE_BACKOFF_MS = 10


def consumer_config(bootstrap: str) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "bench-no-commits",  # assign only: no group is joined, nothing committed
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }


def consume_records(bootstrap: str, topic: str, partitions: int, records: int) -> tuple[float, int, float, float]:
    """A read_committed consumer reading `records` records of the topic's partitions from offset 0
    (assign, no group). Returns (seconds from assign to the last record, records read, CPU seconds
    of this process meanwhile, seconds from assign to the first records)."""
    consumer = Consumer({**consumer_config(bootstrap), "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS})
    try:
        consumer.list_topics(topic, WAIT_S)  # warm-up: connected, metadata known
        started, cpu_start = time.monotonic(), time.process_time()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read = 0
        first_s = None
        while read < records:
            if time.monotonic() - started > WAIT_S:
                raise RuntimeError(f"read {read} of {records} records of {topic} in {WAIT_S} s")
            # No more than are left: consume() returns once it has as many as asked or its timeout has
            # passed, and `records` may be every record of the topic (as many as section 1 produced).
            messages = consumer.consume(min(10_000, records - read), 1.0)
            # Every message's error is looked at, by map() in C: the baseline, a raw SELECT, counts
            # asyncpg's rows without Python code per row, and a Python loop here took client CPU
            # per record the baseline does not spend (docs/performance.md, section 2).
            if any(map(Message.error, messages)):
                raise KafkaException(next(filter(None, map(Message.error, messages))))
            read += len(messages)
            if first_s is None and messages:
                first_s = time.monotonic() - started
        return time.monotonic() - started, read, time.process_time() - cpu_start, first_s
    finally:
        consumer.close()


def commit_to_visible(bootstrap: str, txn_topic: str, plain_topic: str, writes: int) -> tuple[list[float], list[float]]:
    """One record at a time: a transactional producer commits it (the time commit_transaction
    returns: EndTxn answered), and a read_committed consumer in a thread of this process notes when
    poll() hands it over; the next record once it was seen. Then the same with an idempotent
    producer's produce + flush (acknowledged) as the baseline. Returns the two lists of delays, s."""
    return (
        _write_to_visible(bootstrap, txn_topic, writes, transactional=True),
        _write_to_visible(bootstrap, plain_topic, writes, transactional=False),
    )


def _write_to_visible(bootstrap: str, topic: str, writes: int, transactional: bool) -> list[float]:
    seen_at: dict[int, float] = {}
    seen = threading.Condition()
    stop = threading.Event()
    consumer = Consumer({**consumer_config(bootstrap), "fetch.wait.max.ms": 500})
    consumer.assign([TopicPartition(topic, 0, 0)])

    def consume() -> None:
        while not stop.is_set():
            message = consumer.poll(0.05)
            if message is None or message.error():
                continue
            now = time.monotonic()
            with seen:
                seen_at[int(message.value())] = now
                seen.notify_all()

    consuming = threading.Thread(target=consume)
    consuming.start()
    failures = _Failures()
    extra = {"transactional.id": f"{topic}-visible"} if transactional else {}
    producer = Producer(producer_config(bootstrap, on_delivery=failures, **extra))
    delays = []
    try:
        if transactional:
            producer.init_transactions(WAIT_S)
        for index in range(-1, writes):  # -1: a warm-up write, not timed
            time.sleep(0.003)  # the consumer's next fetch is parked in the server
            if transactional:
                producer.begin_transaction()
                producer.produce(topic, str(index).encode(), partition=0)
                producer.commit_transaction(WAIT_S)
            else:
                producer.produce(topic, str(index).encode(), partition=0)
                _flush(producer, failures, f"producer of {topic}")
            acknowledged = time.monotonic()
            with seen:
                if not seen.wait_for(partial(operator.contains, seen_at, index), WAIT_S):
                    raise RuntimeError(f"record {index} of {topic} not seen by the consumer within {WAIT_S} s")
            if index >= 0:
                delays.append(seen_at[index] - acknowledged)
    finally:
        stop.set()
        consuming.join()
        consumer.close()
    return delays
