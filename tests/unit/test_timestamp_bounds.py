"""The edges of a topic's timestamp bounds (append.out_of_timestamp_bounds, KIP-937), as Kafka's
LogValidator draws them: a record exactly `before.max.ms` before the clock, or `after.max.ms` after
it, is accepted, one more millisecond is refused; records without a timestamp of their producer's
(Kafka's -1, HTTP's without timestamp_ms) and topics with LogAppendTime are not bounded. The refusal
names every record out of bounds, in both stored forms. (Pure: batches encoded as the doors encode
them; the refusals over both doors, with PostgreSQL, are tests/kafka/test_topic_configs.py's and
tests/api/test_bad_input.py's.)"""

from __future__ import annotations

import uuid

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder as RecordBuilder

from app.errors import InvalidTimestamps
from app.kafka.record_batches import read_produced
from app.storage.log.append import BatchAppend, check_appendable
from app.storage.log.record_codec import EncodedBatch, TextRecord, encode_batch
from app.storage.log.topics import TopicInfo

NOW_MS = 1_800_000_000_000
BEFORE_MS, AFTER_MS = 60_000, 1_000


def bounded_topic(**config) -> TopicInfo:
    """A topic bounding timestamps to [NOW_MS - BEFORE_MS, NOW_MS + AFTER_MS], or as `config` says."""
    bounds = {"message_timestamp_before_max_ms": BEFORE_MS, "message_timestamp_after_max_ms": AFTER_MS}
    return TopicInfo(1, "bounded", 1, {"max_message_bytes": 1 << 20, **bounds, **config}, False, uuid.uuid4())


def appended(topic: TopicInfo, batch: EncodedBatch, appended_ms: int | None = NOW_MS) -> BatchAppend:
    return BatchAppend(topic, 0, batch, appended_ms=appended_ms)


def http_batch(*timestamps: int | None) -> EncodedBatch:
    """HTTP's records, None for one without timestamp_ms (the server's clock, a little earlier)."""
    return encode_batch([TextRecord("k", "v", (), ts) for ts in timestamps], "utf8", NOW_MS - 5, "records")


def kafka_batch(*timestamps: int) -> EncodedBatch:
    """A Kafka client's batch, read as the Kafka door reads it, in the form storage keeps (built by
    kafka-python's builder, which keeps a timestamp of -1 as given: aiokafka's does not)."""
    builder = RecordBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for index, timestamp in enumerate(timestamps):
        builder.append(index, timestamp, b"k", b"v", [])
    produced = read_produced(bytes(builder.build()), 1 << 20)
    return EncodedBatch.record_batch(
        produced.stored,
        produced.record_count,
        produced.largest_record_bytes,
        produced.first_timestamp_ms,
        produced.max_timestamp_ms,
        produced.uncompressed_bytes,
        produced.keyless_records,
        produced.producer_timestamps,
    )


@pytest.mark.parametrize("form", [http_batch, kafka_batch])
def test_the_bounds_are_inclusive_as_kafkas(form):
    topic = bounded_topic()
    assert check_appendable(appended(topic, form(NOW_MS - BEFORE_MS, NOW_MS, NOW_MS + AFTER_MS))) is None
    for out in (NOW_MS - BEFORE_MS - 1, NOW_MS + AFTER_MS + 1):
        refused = check_appendable(appended(topic, form(NOW_MS, out)))
        assert isinstance(refused, InvalidTimestamps)
        assert (refused.timestamps, refused.earliest_ms, refused.latest_ms) == (
            ((1, out),),
            NOW_MS - BEFORE_MS,
            NOW_MS + AFTER_MS,
        )


@pytest.mark.parametrize("form", [http_batch, kafka_batch])
def test_the_refusal_names_every_record_out_of_bounds(form):
    timestamps = [NOW_MS + AFTER_MS + 1] * 3 + [NOW_MS] + [NOW_MS - BEFORE_MS - 1] * 10
    refused = check_appendable(appended(bounded_topic(), form(*timestamps)))
    assert refused.record_indexes == (0, 1, 2, *range(4, 14))
    assert refused.message.startswith(f"record 0 of the batch to bounded-0 has timestamp {NOW_MS + AFTER_MS + 1}")
    assert f"more than the topic's message_timestamp_after_max_ms ({AFTER_MS}) allows" in refused.message
    assert "records 1, 2, 4, 5, 6, 7, 8, 9, 10, 11 ... are out of bounds too" in refused.message


def test_records_without_a_producers_timestamp_are_not_bounded():
    zero = bounded_topic(message_timestamp_before_max_ms=0, message_timestamp_after_max_ms=0)
    # Stamped by the server 5 ms before the clock of the write: out of a zero bound, yet not refused.
    assert check_appendable(appended(zero, http_batch(None, None))) is None
    assert check_appendable(appended(zero, kafka_batch(-1, -1))) is None  # Kafka's NO_TIMESTAMP
    assert check_appendable(appended(zero, kafka_batch(-1, NOW_MS + 1))).record_indexes == (1,)


@pytest.mark.parametrize("form", [http_batch, kafka_batch])
def test_log_append_time_and_the_default_bound_nothing(form):
    far = form(0, NOW_MS + 10 * 365 * 86_400_000)
    assert check_appendable(appended(bounded_topic(message_timestamp_type="LogAppendTime"), far)) is None
    unbounded = TopicInfo(1, "unbounded", 1, {"max_message_bytes": 1 << 20}, False, uuid.uuid4())
    assert check_appendable(appended(unbounded, far)) is None


def test_the_servers_own_batches_are_not_bounded():
    """The transaction log's and the groups' records carry the server's clock and no append time."""
    assert check_appendable(appended(bounded_topic(), http_batch(NOW_MS - 10 * BEFORE_MS), None)) is None
