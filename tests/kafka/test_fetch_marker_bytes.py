"""A Fetch counts a transaction's marker as Kafka's broker counts it: the control batch it is sent as
(MARKER_BATCH_BYTES), toward min_bytes, max_bytes and each partition's max_bytes, like any batch.
A marker's stored row has no size: a fetch whose only batch was a marker long-polled the whole
max_wait (aiokafka's own test `test_consumer_*_read_only_control_record` seeks a consumer to a
marker and expects its position past it within its 0.5 s fetch wait, which it was not), and
markers took no share of a fetch's bytes. KIP-74's first batch is still answered whatever the
limits, also when it is a marker."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import time

from kafka.record.memory_records import MemoryRecords

from app.kafka.record_batches import control_batch
from app.storage.log.partition_log import MARKER_BATCH_BYTES
from tests.kafka.clients import create_topic
from tests.kafka.http_side import produce
from tests.kafka.raw import RawConnection
from tests.kafka.raw_transactions import one_committed_batch
from tests.kafka.test_fetch_read_ahead import answered, fetch_request

FETCH_BY_NAME = 12
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
# Far longer than an answer takes: a fetch answered near it waited for it.
LONG_WAIT = datetime.timedelta(seconds=10)
ANSWERED_AT_ONCE_S = 2.0


def timed_fetch(connection, topic: str, offset: int, min_bytes: int, isolation: int):
    """Partition 0 from `offset`, waiting up to LONG_WAIT for min_bytes: (answer, seconds taken)."""
    request = dataclasses.replace(
        fetch_request(None, FETCH_BY_NAME, topic, [(0, offset)], 1_048_576, isolation),
        max_wait=LONG_WAIT,
        min_bytes=min_bytes,
    )
    started = time.monotonic()
    response = connection.call(request)
    return answered(response)[0], time.monotonic() - started


@contextlib.contextmanager
def a_committed_transaction(server, topic: str, partitions: int = 1):
    """A new topic whose partition 0 holds a committed transaction: its batch (offset 0) and marker
    (1); yields a raw connection to the server."""
    create_topic(server, topic, partitions)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        one_committed_batch(connection, f"tid-{topic}", topic, [b"committed"])
        yield connection


def batches_of(partition) -> list[tuple[int, bool]]:
    """(base offset, is a control batch) of each batch of the answer."""
    records = MemoryRecords(bytes(partition.records))
    found = []
    while (batch := records.next_batch()) is not None:
        found.append((batch.base_offset, batch.is_control_batch))
    return found


def test_a_marker_counts_its_control_batch_toward_min_bytes(module_kafka_server):
    topic = "fetch-min-bytes-marker"
    with a_committed_transaction(module_kafka_server, topic) as connection:
        for isolation in (READ_UNCOMMITTED, READ_COMMITTED):
            # From the marker: its control batch alone, which is more than min_bytes 1.
            marker, taken = timed_fetch(connection, topic, 1, 1, isolation)
            assert batches_of(marker) == [(1, True)]
            assert taken < ANSWERED_AT_ONCE_S, f"a fetch whose only batch is a marker waited {taken:.1f} s"

            # From the start: the data batch and the marker, min_bytes all of their bytes.
            whole, _ = timed_fetch(connection, topic, 0, 1, isolation)
            assert batches_of(whole) == [(0, False), (1, True)]
            again, taken = timed_fetch(connection, topic, 0, len(whole.records), isolation)
            assert batches_of(again) == [(0, False), (1, True)]
            assert taken < ANSWERED_AT_ONCE_S, f"the marker's bytes were not counted: waited {taken:.1f} s"


def test_the_marker_size_counted_is_the_control_batch_sent():
    """The core counts a marker as MARKER_BATCH_BYTES; the Kafka door sends it as this control batch."""
    for offset, producer_id, epoch, control_type, timestamp_ms in [(0, 0, 0, 0, 0), (2**40, 2**40, 32_000, 1, 2**41)]:
        assert len(control_batch(offset, producer_id, epoch, control_type, timestamp_ms)) == MARKER_BATCH_BYTES


def whole_batches(connection, topic: str, offsets: list[tuple[int, int]], partition_max_bytes: int, max_bytes: int):
    """Partitions from (partition, offset) each, read_committed, at once: {partition: batches_of}."""
    request = dataclasses.replace(
        fetch_request(None, FETCH_BY_NAME, topic, offsets, partition_max_bytes, READ_COMMITTED),
        max_bytes=max_bytes,
        max_wait=datetime.timedelta(0),
    )
    return {index: batches_of(partition) for index, partition in answered(connection.call(request)).items()}


def test_a_marker_counts_its_control_batch_toward_a_partitions_max_bytes(module_kafka_server):
    topic = "fetch-max-bytes-marker"
    with a_committed_transaction(module_kafka_server, topic) as connection:
        whole, _ = timed_fetch(connection, topic, 0, 1, READ_COMMITTED)
        assert batches_of(whole) == [(0, False), (1, True)]
        data_bytes = len(whole.records) - MARKER_BATCH_BYTES
        # The data batch fits, the marker after it does not: the next fetch starts at the marker.
        assert whole_batches(connection, topic, [(0, 0)], data_bytes + MARKER_BATCH_BYTES - 1, 1 << 20) == {
            0: [(0, False)]
        }
        assert whole_batches(connection, topic, [(0, 0)], data_bytes + MARKER_BATCH_BYTES, 1 << 20) == {
            0: [(0, False), (1, True)]
        }


def test_a_marker_counts_toward_the_fetchs_max_bytes(module_kafka_server):
    topic = "fetch-max-bytes-marker-fetch"
    with a_committed_transaction(module_kafka_server, topic, partitions=2) as connection:
        produce(module_kafka_server, topic, 1, [{"value": "x" * 100}])  # partition 1: a batch of 100 bytes
        # Partition 0's marker is the fetch's first batch; partition 1's batch must fit what is left.
        asked = [(0, 1), (1, 0)]
        assert whole_batches(connection, topic, asked, 1 << 20, MARKER_BATCH_BYTES + 99) == {0: [(1, True)], 1: []}
        assert whole_batches(connection, topic, asked, 1 << 20, MARKER_BATCH_BYTES + 100) == {
            0: [(1, True)],
            1: [(0, False)],
        }


def test_a_marker_first_is_answered_whatever_max_bytes(module_kafka_server):
    # KIP-74: the first batch of the first partition that has one is answered whatever the limits, so
    # a reader always makes progress: a marker, then the batch after it, one fetch each.
    server = module_kafka_server
    topic = "fetch-max-bytes-marker-first"
    with a_committed_transaction(server, topic, partitions=2) as connection:
        produce(server, topic, 0, [{"value": "x" * 100}])  # 2
        for limit in (1, 0, -1):
            assert whole_batches(connection, topic, [(0, 1)], limit, limit) == {0: [(1, True)]}
            assert whole_batches(connection, topic, [(0, 2)], limit, limit) == {0: [(2, False)]}
        # A later partition gets no batch that does not fit, a marker neither.
        produce(server, topic, 1, [{"value": "y"}])
        assert whole_batches(connection, topic, [(1, 0), (0, 1)], MARKER_BATCH_BYTES - 1, 1 << 20) == {
            1: [(0, False)],
            0: [],
        }
