"""A Fetch is answered once the batches it carries reach min_bytes, counted as Kafka's broker counts
them: every batch sent, a transaction's marker (its control batch) too. A marker's stored row has no
size, and a fetch whose only batch was a marker long-polled the whole max_wait: aiokafka's own test
(`test_consumer_*_read_only_control_record`) seeks a consumer to a marker and expects its position
past it within its 0.5 s fetch wait, which it was not."""

from __future__ import annotations

import dataclasses
import datetime
import time

from kafka.record.memory_records import MemoryRecords

from app.kafka.record_batches import control_batch
from app.storage.log.batch_reads import MARKER_BATCH_BYTES
from tests.kafka.clients import create_topic
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


def batches_of(partition) -> list[tuple[int, bool]]:
    """(base offset, is a control batch) of each batch of the answer."""
    records = MemoryRecords(bytes(partition.records))
    found = []
    while (batch := records.next_batch()) is not None:
        found.append((batch.base_offset, batch.is_control_batch))
    return found


def test_a_marker_counts_its_control_batch_toward_min_bytes(module_kafka_server):
    server = module_kafka_server
    topic = "fetch-min-bytes-marker"
    create_topic(server, topic, 1)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        one_committed_batch(connection, "tid-fetch-min-bytes-marker", topic, [b"committed"])

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
