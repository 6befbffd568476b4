"""Requests that name one partition more than once get the answer Apache Kafka's broker gives, as
read in its code: Produce, Fetch and DeleteRecords key their partitions in a map (the last mention
is the partition's, answered once; KafkaApis.handleProduceRequest, FetchRequest.fetchData,
KafkaApis.handleDeleteRecordsRequest). Nothing is written for a mention that is refused or
replaced. OffsetCommit's (each mention answered) is test_boundary_values.py's, AddPartitionsToTxn's
test_security.py's (a refusal needs a principal's ACLs)."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from tests.kafka import http_side
from tests.kafka.clients import create_topic, topic_uuid
from tests.kafka.raw import RawConnection, nested, record_batch, request_of
from tests.kafka.test_api_versions import sample_request

TIMEOUT = datetime.timedelta(seconds=30)
# The first Produce and Fetch versions naming topics by id (KIP-516).
TOPIC_IDS_SINCE = 13


def call(server, request):
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        return connection.call(request)


def batch_of(*values: str) -> bytes:
    return record_batch([KafkaRecord(1_700_000_000_000, None, value.encode(), []) for value in values])


def values_in(server, topic: str, partition: int) -> list[tuple[int, bytes]]:
    return [(r["offset"], http_side.unb64(r["value"])) for r in http_side.fetch(server, topic, partition)]


def topic_id_of(server, topic: str):
    return topic_uuid(server.client.get(f"/v1/topics/{topic}").json()["topic_id"])


def partition_state(server, topic: str, partition: int) -> dict:
    return server.client.get(f"/v1/topics/{topic}").json()["partitions"][partition]


# ---- Produce


def produce_request(server, version: int, topic: str, *topic_entries: tuple[tuple[int, bytes | None], ...]):
    """One TopicProduceData per entry of (partition, records) pairs, naming `topic` by name, or by id from v13."""
    topic_id = topic_id_of(server, topic) if version >= TOPIC_IDS_SINCE else None
    key = api_table.PRODUCE
    return request_of(
        key,
        version,
        transactional_id=None,
        acks=-1,
        timeout=TIMEOUT,
        topic_data=tuple(
            nested(
                key,
                version,
                "TopicProduceData",
                name=topic,
                topic_id=topic_id,
                partition_data=tuple(
                    nested(key, version, "PartitionProduceData", index=index, records=records)
                    for index, records in entry
                ),
            )
            for entry in topic_entries
        ),
    )


def produce_answers(response) -> list[tuple[int, KafkaError, int]]:
    assert len(response.responses) == 1, "a topic is answered in one entry"
    [topic] = response.responses
    return [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses]


@pytest.mark.parametrize("version", [9, 13])
@pytest.mark.parametrize("entries", ["one-entry", "two-entries"])
def test_produce_writes_a_partition_named_twice_once_with_its_last_batch(module_kafka_server, version, entries):
    """Regression: each mention was answered, the first one's batch written and the second one
    refused (INVALID_REQUEST). Kafka's broker keys a Produce's batches by partition: the last
    mention's batch replaces the earlier one's, only it is written, and the partition is answered
    once (its ProduceResponse is built from that map, a topic in one entry)."""
    topic = f"named-twice-produce-v{version}-{entries}"
    create_topic(module_kafka_server, topic, 2)
    first, last, other = (0, batch_of("first-a", "first-b")), (0, batch_of("last")), (1, batch_of("other"))
    if entries == "one-entry":
        request = produce_request(module_kafka_server, version, topic, (first, other, last))
    else:
        request = produce_request(module_kafka_server, version, topic, (first, other), (last,))
    assert produce_answers(call(module_kafka_server, request)) == [(0, KafkaError.none, 0), (1, KafkaError.none, 0)]
    assert values_in(module_kafka_server, topic, 0) == [(0, b"last")]
    assert values_in(module_kafka_server, topic, 1) == [(0, b"other")]


def corrupt(batch: bytes) -> bytes:
    flipped = bytearray(batch)
    flipped[-1] ^= 0xFF  # a byte of the last record's value: the CRC no longer matches
    return bytes(flipped)


@pytest.mark.parametrize("refused", ["first", "last"])
def test_produce_of_a_partition_named_twice_with_a_refused_batch_writes_neither(module_kafka_server, refused):
    """Regression: with the refused batch last, the first one was written and answered NONE while
    the second was answered INVALID_REQUEST. Kafka answers the partition once with the refused
    batch's error (its map of refusals is merged over the appends' answers); txbroker then writes
    none of its batches, so an error answered never comes with a write."""
    topic = f"named-twice-produce-refused-{refused}"
    create_topic(module_kafka_server, topic, 2)
    good, bad = (0, batch_of("good")), (0, corrupt(batch_of("bad")))
    mentions = (bad, (1, batch_of("other")), good) if refused == "first" else (good, (1, batch_of("other")), bad)
    response = call(module_kafka_server, produce_request(module_kafka_server, 9, topic, mentions))
    assert produce_answers(response) == [(0, KafkaError.corrupt_message, -1), (1, KafkaError.none, 0)]
    assert partition_state(module_kafka_server, topic, 0)["high_watermark"] == 0
    assert values_in(module_kafka_server, topic, 1) == [(0, b"other")]


# ---- Fetch


def fetch_request(server, version: int, topic: str, *offsets: tuple[int, int]):
    """A Fetch of (partition, fetch offset) each, naming `topic` by name, or by id from v13."""
    by_id = version >= TOPIC_IDS_SINCE
    sample = sample_request(api_table.FETCH, version, None, topic_id_of(server, topic) if by_id else None)
    [sample_topic] = sample.topics
    [sample_partition] = sample_topic.partitions
    partitions = tuple(
        dataclasses.replace(sample_partition, partition=index, fetch_offset=offset) for index, offset in offsets
    )
    named = {} if by_id else {"topic": topic}
    return dataclasses.replace(sample, topics=(dataclasses.replace(sample_topic, partitions=partitions, **named),))


def first_batch_offset(answer) -> int:
    from kafka.record.memory_records import MemoryRecords

    return MemoryRecords(bytes(answer.records)).next_batch().base_offset


@pytest.mark.parametrize("version", [12, 13])
def test_fetch_of_a_partition_named_twice_reads_it_once_from_the_last_offset(module_kafka_server, version):
    """Regression: each mention was read and answered. Kafka's FetchRequest.fetchData is a map by
    partition: the partition is read once, from its last mention's offset, and answered once."""
    topic = f"named-twice-fetch-v{version}"
    create_topic(module_kafka_server, topic, 2)
    for value in ("a", "b"):
        http_side.produce(module_kafka_server, topic, 0, [{"value": value}])
    http_side.produce(module_kafka_server, topic, 1, [{"value": "c"}])
    response = call(module_kafka_server, fetch_request(module_kafka_server, version, topic, (0, 0), (1, 0), (0, 1)))
    [answered] = response.responses
    assert [(p.partition_index, p.error_code) for p in answered.partitions] == [
        (0, KafkaError.none),
        (1, KafkaError.none),
    ]
    assert [first_batch_offset(p) for p in answered.partitions] == [1, 0]


# ---- DeleteRecords


def delete_records_request(topic: str, *topic_entries: tuple[tuple[int, int], ...]):
    key, version = api_table.DELETE_RECORDS, 2
    return request_of(
        key,
        version,
        topics=tuple(
            nested(
                key,
                version,
                "DeleteRecordsTopic",
                name=topic,
                partitions=tuple(
                    nested(key, version, "DeleteRecordsPartition", partition_index=index, offset=offset)
                    for index, offset in entry
                ),
            )
            for entry in topic_entries
        ),
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize(
    ("last_offset", "answer", "log_start"),
    [(2, (KafkaError.none, 2), 2), (11, (KafkaError.offset_out_of_range, -1), 0)],
    ids=["lower", "out-of-range"],
)
@pytest.mark.parametrize("entries", ["one-entry", "two-entries"])
def test_delete_records_of_a_partition_named_twice_applies_its_last_offset(
    module_kafka_server, last_offset, answer, log_start, entries
):
    """Regression: each mention was applied and answered, so the first one's offset (5) moved the
    log start, also when the last mention was refused. Kafka's broker keys the offsets by
    partition: only the last mention's offset is applied, the partition answered once (the topic
    in one entry)."""
    topic = f"named-twice-delete-records-{last_offset}-{entries}"
    create_topic(module_kafka_server, topic, 2)
    http_side.produce(module_kafka_server, topic, 0, [{"value": f"v{i}"} for i in range(10)])
    if entries == "one-entry":
        request = delete_records_request(topic, ((0, 5), (1, 0), (0, last_offset)))
    else:
        request = delete_records_request(topic, ((0, 5), (1, 0)), ((0, last_offset),))
    response = call(module_kafka_server, request)
    [answered] = response.topics
    assert [(p.partition_index, p.error_code, p.low_watermark) for p in answered.partitions] == [
        (0, *answer),
        (1, KafkaError.none, 0),
    ]
    assert partition_state(module_kafka_server, topic, 0)["log_start_offset"] == log_start
