"""confluent-kafka (librdkafka 2.x), unmodified, against the Kafka listener: produce (idempotent or
not, acks=all and acks=0, every codec, headers, exact timestamps, nulls, the client's partitioner),
consume with assign + seek under both isolation levels against transactions written over HTTP,
ListOffsets, and records crossing the two doors byte for byte."""

from __future__ import annotations

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, consume, create_topic, produce_all
from txbroker.partitioner import partition_for_key

BINARY = bytes(range(256))  # not UTF-8: stored in the base64 form


def _as_tuples(messages) -> list[tuple]:
    return [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in messages]


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_produce_and_consume_keep_every_field(module_kafka_server, idempotent):
    topic = f"fields-{idempotent}"
    create_topic(module_kafka_server, topic)
    sent = [
        {"key": b"k1", "value": b"v1", "headers": [("h1", b"x"), ("h2", None), ("h1", b"again")], "timestamp": 1},
        {"key": None, "value": b"null key", "timestamp": 1_700_000_000_123},
        {"key": b"null value", "value": None, "timestamp": 1_700_000_000_124},
        {"key": None, "value": None, "timestamp": 1_700_000_000_125},
        {"key": BINARY, "value": BINARY, "headers": [("bin", BINARY)], "timestamp": 2**41 + 7},
        {"key": "ünïcode".encode(), "value": "välue €".encode(), "timestamp": 1_700_000_000_999},
    ]
    delivered = produce_all(
        module_kafka_server, topic, sent, **{"enable.idempotence": idempotent, "acks": "all", "linger.ms": 5}
    )
    assert [m.offset() for m in delivered] == list(range(len(sent)))
    received = consume(module_kafka_server, topic, 0, len(sent))
    assert _as_tuples(received) == [
        (
            offset,
            message["key"],
            message["value"],
            message.get("headers") or None,
            (TIMESTAMP_CREATE_TIME, message["timestamp"]),
        )
        for offset, message in enumerate(sent)
    ]


def test_acks_zero_writes_without_answers(module_kafka_server):
    topic = "acks-zero"
    create_topic(module_kafka_server, topic)
    sent = [{"value": f"fire-and-forget-{i}".encode()} for i in range(20)]
    produce_all(module_kafka_server, topic, sent, **{"acks": 0, "enable.idempotence": False})
    received = consume(module_kafka_server, topic, 0, len(sent))
    assert [m.value() for m in received] == [m["value"] for m in sent]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_each_compression_codec(module_kafka_server, codec):
    topic = f"codec-{codec}"
    create_topic(module_kafka_server, topic)
    sent = [{"key": f"key-{i % 3}".encode(), "value": b"compressible " * 50 + str(i).encode()} for i in range(200)]
    produce_all(module_kafka_server, topic, sent, **{"compression.type": codec, "linger.ms": 50})
    received = consume(module_kafka_server, topic, 0, len(sent))
    assert [(m.key(), m.value()) for m in received] == [(m["key"], m["value"]) for m in sent]


def test_the_clients_partitioner_decides_and_the_records_are_where_it_said(module_kafka_server):
    topic, partitions = "partitioner", 6
    create_topic(module_kafka_server, topic, partitions)
    sent = [{"key": f"customer-{i}".encode(), "value": str(i).encode()} for i in range(60)]
    # murmur2_random: the Java client's default partitioner, which the HTTP door's also follows.
    delivered = produce_all(module_kafka_server, topic, sent, partitioner="murmur2_random")
    for message in delivered:
        assert message.partition() == partition_for_key(message.key(), partitions)
    by_partition = {}
    for message in delivered:
        by_partition.setdefault(message.partition(), []).append(message.value())
    assert len(by_partition) > 1
    for partition, values in by_partition.items():
        assert [m.value() for m in consume(module_kafka_server, topic, partition, len(values))] == values


def test_kafka_records_read_back_over_http_byte_for_byte(module_kafka_server):
    topic = "kafka-to-http"
    create_topic(module_kafka_server, topic)
    sent = [
        {"key": BINARY, "value": b"text", "headers": [("h", BINARY)], "timestamp": 1_600_000_000_001},
        {"key": None, "value": "plain ütf-8".encode(), "headers": [("empty", b""), ("null", None)], "timestamp": 5},
        {"key": b"", "value": None, "timestamp": 6},
    ]
    produce_all(module_kafka_server, topic, sent)
    records = http_side.fetch(module_kafka_server, topic, 0)
    assert [
        (
            r["offset"],
            http_side.unb64(r["key"]),
            http_side.unb64(r["value"]),
            [(h["key"], http_side.unb64(h["value"])) for h in r["headers"]],
            r["timestamp_ms"],
        )
        for r in records
    ] == [(offset, m["key"], m["value"], m.get("headers", []), m["timestamp"]) for offset, m in enumerate(sent)]


def test_http_records_read_back_over_kafka_byte_for_byte(module_kafka_server):
    topic = "http-to-kafka"
    create_topic(module_kafka_server, topic)
    http_side.produce(
        module_kafka_server,
        topic,
        0,
        [
            {
                "key": http_side.b64(BINARY),
                "value": http_side.b64(b"v"),
                "headers": [{"key": "h", "value": http_side.b64(BINARY)}],
                "timestamp_ms": 1_234_567_890_123,
            },
            {"key": None, "value": None, "headers": [{"key": "n", "value": None}], "timestamp_ms": 7},
        ],
        encoding="base64",
    )
    http_side.produce(
        module_kafka_server, topic, 0, [{"key": "clé", "value": "välue", "timestamp_ms": 1_700_000_000_000}]
    )
    received = consume(module_kafka_server, topic, 0, 3)
    assert _as_tuples(received) == [
        (0, BINARY, b"v", [("h", BINARY)], (TIMESTAMP_CREATE_TIME, 1_234_567_890_123)),
        (1, None, None, [("n", None)], (TIMESTAMP_CREATE_TIME, 7)),
        (2, "clé".encode(), "välue".encode(), None, (TIMESTAMP_CREATE_TIME, 1_700_000_000_000)),
    ]


def _values(messages) -> list[bytes]:
    return [m.value() for m in messages]


def test_isolation_levels_against_http_transactions(module_kafka_server):
    """An aborted transaction is never seen by read_committed, and no marker surfaces at either
    level; an open transaction holds read_committed at its first offset (the last stable offset)."""
    topic = "isolation"
    create_topic(module_kafka_server, topic)
    http_side.produce(module_kafka_server, topic, 0, [{"value": "before"}])
    aborted = http_side.HttpTransaction(module_kafka_server, "kafka-isolation-aborted")
    aborted.produce(topic, 0, ["aborted-1", "aborted-2"])
    aborted.end(committed=False)
    committed = http_side.HttpTransaction(module_kafka_server, "kafka-isolation-committed")
    committed.produce(topic, 0, ["committed-1"])
    committed.produce(topic, 0, ["committed-2"])
    committed.end(committed=True)
    http_side.produce(module_kafka_server, topic, 0, [{"value": "after"}])
    # offsets: before 0, aborted 1-2, ABORT marker 3, committed 4-5, COMMIT marker 6, after 7
    read_committed = consume(module_kafka_server, topic, 0, 4, **{"isolation.level": "read_committed"})
    assert [(m.offset(), m.value()) for m in read_committed] == [
        (0, b"before"),
        (4, b"committed-1"),
        (5, b"committed-2"),
        (7, b"after"),
    ]
    read_uncommitted = consume(module_kafka_server, topic, 0, 6, **{"isolation.level": "read_uncommitted"})
    assert [(m.offset(), m.value()) for m in read_uncommitted] == [
        (0, b"before"),
        (1, b"aborted-1"),
        (2, b"aborted-2"),
        (4, b"committed-1"),
        (5, b"committed-2"),
        (7, b"after"),
    ]

    still_open = http_side.HttpTransaction(module_kafka_server, "kafka-isolation-open")
    still_open.produce(topic, 0, ["open-1"])  # offset 8: the last stable offset while open
    http_side.produce(module_kafka_server, topic, 0, [{"value": "after-open"}])
    assert _values(consume(module_kafka_server, topic, 0, 0, 8, **{"isolation.level": "read_committed"})) == []
    assert _values(consume(module_kafka_server, topic, 0, 2, 8, **{"isolation.level": "read_uncommitted"})) == [
        b"open-1",
        b"after-open",
    ]
    still_open.end(committed=True)
    assert _values(consume(module_kafka_server, topic, 0, 2, 8, **{"isolation.level": "read_committed"})) == [
        b"open-1",
        b"after-open",
    ]


def test_list_offsets_earliest_latest_and_by_time(module_kafka_server):
    topic = "list-offsets"
    create_topic(module_kafka_server, topic)
    produce_all(module_kafka_server, topic, [{"value": str(i).encode(), "timestamp": 1000 * (i + 1)} for i in range(5)])
    consumer = Consumer({"bootstrap.servers": module_kafka_server.extra["kafka_bootstrap"], "group.id": "unused"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT_S) == (0, 5)
        found = consumer.offsets_for_times([TopicPartition(topic, 0, 2500)], timeout=WAIT_S)
        assert found[0].offset == 2  # the first record at or after 2500 ms is the third
        found = consumer.offsets_for_times([TopicPartition(topic, 0, 10_000)], timeout=WAIT_S)
        assert found[0].offset == -1  # none that late: Kafka answers -1 (librdkafka: OFFSET_END)
    finally:
        consumer.close()


def test_a_topic_is_created_when_a_producer_names_it(module_kafka_server):
    topic = "auto-created"
    delivered = produce_all(module_kafka_server, topic, [{"value": b"first"}])
    assert delivered[0].offset() == 0
    described = module_kafka_server.client.get(f"/v1/topics/{topic}")
    assert described.status_code == 200 and len(described.json()["partitions"]) == 1
